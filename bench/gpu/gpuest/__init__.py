"""The parts of ``bench/gpu/gpu_estimate.py`` (the command line and its docstring are there):

- ``models``: the paper's backbone shapes, random-weight models of them, the newline bias, parameter counts;
- ``decode``: timed decode runs (our sampler, HF ``generate``, the bare model's loop) and their timelines;
- ``measure``: the measured path on a GPU (decode runs, pretraining stages (b)-(f), the CPU fits);
- ``estimate``: the profile's work counts times the measured seconds (hours per stage and pair);
- ``opcount``: aten ops and host-serial time of a decode iteration, counted on a CPU (``DecodeProbe``);
- ``analytic``: the cost model of one H100 SXM (``--analytic``) for the eager engine;
- ``staticops``: the static decode path's ops and host-serial time, counted on a CPU (``StaticProbe``);
- ``graph``: the static path captured as CUDA graphs in the cost model, the bandwidth floor, and the
  estimates of the other decode paths (``path_estimates``);
- ``analytic_run``: the ``--analytic`` run (inputs measured or read back, constants, sensitivity);
- ``render`` and ``page.md.j2``: the book section rendered from an analytic JSON.
"""
