"""The stages: each wires the typed config, the data, the algorithms (``ctrls.spectral``,
``states``, ``policy``, ``adapter``, ``elbo``, ``rl``, ``sampling``, ``metrics``; these take tensors)
and the artifacts on disk under ``runs/<profile>/``, resumably (``ctrls.runs``).

- ``collect``: pretraining (a) and (b), sampled chains of thought and their hidden states;
- ``pretrain``: Alg. 1, (c)-(g): spectral embeddings, states, transitions, adapter, checkpoint;
- ``exploration``: Table 1's grid of Base and CTRLS samples;
- ``rl``: Alg. 2 on a real backbone, every run of a pair in lockstep, and the Table 2 samples;
- ``judge``: Table 3's rubric scores;
- ``synthetic``: the controlled study on a synthetic latent chain.

The tables built from these artifacts are in ``ctrls.tables``; the paper's numbers in ``ctrls.paper``.
"""
