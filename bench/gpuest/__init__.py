"""The parts of ``bench/gpu_estimate.py`` (the command line and its docstring are there):

- ``models``: the paper's backbone shapes, random-weight models of them, the newline bias, parameter counts;
- ``decode``: timed decode runs (our sampler, HF ``generate``, the bare model's loop) and their timelines;
- ``measure``: the measured path on a GPU (decode runs, pretraining stages (b)-(f), the CPU fits);
- ``estimate``: the profile's work counts times the measured seconds (hours per stage and pair);
- ``opcount``: aten ops and host-serial time of a decode iteration, counted on a CPU (``DecodeProbe``);
- ``analytic``: the cost model of one H100 SXM (``--analytic``) and its inputs;
- ``render`` and ``page.md.j2``: the book section rendered from an analytic JSON.
"""
