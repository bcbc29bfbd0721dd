"""The stages: each wires the typed config, the data, the algorithms and the artifacts on disk
under ``runs/<profile>/``, resumably.

Floor 7: imports every floor below; only ``ctrls.report`` and the CLI import it.

- ``runs``: run directories, done markers and the stage lock; ``distributed``: data parallelism;
- ``collect``, ``adapter_train``, ``pretrain``: Alg. 1, pretraining (a)-(g);
- ``exploration``: Table 1's grid; ``trainer``, ``rl``: Alg. 2 and Table 2's samples;
- ``judge``: Table 3's scores; ``synthetic``: the controlled study; ``common``: what they share.
"""
