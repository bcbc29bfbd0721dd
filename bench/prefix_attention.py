"""The demo's decode with each step attending to the prompts' shared prefix once for all rows
(``ctrls.generate.kv_cache.shared_prefix_attention``), against attending over every row's whole cache,
side by side in one run.

SmolLM2-135M-Instruct, fp32, the demo's own decode: 32 word-problem questions x 4 samples (128 rows, the
demo's ``sampling.batch_size``) with its 1-shot chat prompt, eta = 0.7, rows ending at EOS / the answer
line / 80 tokens. Each variant is timed twice, alternating, and the faster run kept; both must give the
same tokens. The last line printed is a JSON object; ``--out`` writes it too, with the machine.
Usage: python bench/prefix_attention.py [--out bench/results/prefix_attention.json]
"""
from __future__ import annotations

import argparse
import contextlib

from common import demo_decode, machine, timed_decode, write_result

import ctrls.generate.sampling as S

SPLIT = S.shared_prefix_attention


@contextlib.contextmanager
def whole_cache(whole: bool):
    """Within the block, ``whole``: every row attends over its whole cache (the prefix once per row)."""
    S.shared_prefix_attention = (lambda lm, n: contextlib.nullcontext()) if whole else SPLIT
    try:
        yield
    finally:
        S.shared_prefix_attention = SPLIT


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    bb, prompts, p = demo_decode()
    best, toks = {True: float("inf"), False: float("inf")}, {}
    for _ in range(2):
        for whole in (True, False):
            t, toks[whole] = timed_decode(bb, prompts, p, whole_cache(whole))
            best[whole] = min(best[whole], t)
    res = {"machine": machine(), "rows": 4 * len(prompts), "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
           "shared_prefix_tokens": S.shared_prefix_length(prompts), "new_tokens": sum(map(len, toks[False])),
           "whole_cache_seconds": round(best[True], 2), "shared_prefix_seconds": round(best[False], 2),
           "speedup": round(best[True] / best[False], 3), "tokens_equal": toks[True] == toks[False],
           "command": "python bench/prefix_attention.py --out bench/results/prefix_attention.json"}
    print(f"decode: whole cache per row {best[True]:.1f} s, shared prefix once {best[False]:.1f} s "
          f"({best[True] / best[False]:.2f}x); tokens equal: {toks[True] == toks[False]}", flush=True)
    write_result(res, args.out)


if __name__ == "__main__":
    main()
