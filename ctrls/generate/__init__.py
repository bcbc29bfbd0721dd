"""Generation: decoding Base and CTRLS with the KV cache, and scoring what was generated.

Floor 4: imports the floors below (errors, stats, data, method); never the config.

- ``sampling``: ``sample``, the batched sampler (one call for Base and CTRLS rows);
- ``decoding``, ``kv_cache``, ``static_decode``: the engine beneath it (eager, cached and static-shape steps);
- ``controllability``: does each generated step land in its drawn state;
- ``judge``: the rubric judge of Table 3 (a local model or an OpenAI-compatible server).
"""
