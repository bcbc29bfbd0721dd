"""The demo's decode with the prompts' shared prefix prefilled once per batch, against every prompt
prefilled whole (``ctrls.generate.sampling.shared_prefix_length``), side by side in one run.

SmolLM2-135M-Instruct, fp32, the demo's own decode: 32 word-problem questions x 4 samples (128 rows,
the demo's ``sampling.batch_size``) with its 1-shot chat prompt, eta = 0.7, rows ending at EOS / the
answer line / 80 tokens. Each variant is timed twice, alternating, and the faster run kept; the
prefill alone is timed the same way (``max_new_tokens=1``). Also checks that both give the same
tokens. The last line printed is a JSON object; ``--out`` writes it too, with the machine.
Usage: python bench/prefill.py [--out bench/results/prefill.json]
"""
from __future__ import annotations

import argparse
import contextlib
from dataclasses import replace

from common import demo_decode, machine, timed_decode, write_result

import ctrls.generate.decoding as D
import ctrls.generate.sampling as S


@contextlib.contextmanager
def prompts_whole(whole: bool):
    """Within the block, ``whole``: every prompt prefilled whole (no shared prefix)."""
    keep = D.MIN_SHARED_PREFIX
    D.MIN_SHARED_PREFIX = 10**9 if whole else keep
    try:
        yield
    finally:
        D.MIN_SHARED_PREFIX = keep


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    bb, prompts, p = demo_decode()
    res = {"machine": machine(),
           "rows": 4 * len(prompts), "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
           "shared_prefix_tokens": S.shared_prefix_length(prompts)}
    for name, params in (("prefill", replace(p, max_new_tokens=1)), ("decode", p)):
        best = {True: float("inf"), False: float("inf")}
        toks = {}
        for _ in range(2):
            for whole in (True, False):
                t, toks[whole] = timed_decode(bb, prompts, params, prompts_whole(whole))
                best[whole] = min(best[whole], t)
        res[name] = {"whole_seconds": best[True], "shared_seconds": best[False],
                     "speedup": best[True] / best[False], "tokens_equal": toks[True] == toks[False]}
        print(f"{name}: prompts prefilled whole {best[True]:.1f} s, shared prefix once {best[False]:.1f} s "
              f"({best[True] / best[False]:.2f}x); tokens equal: {toks[True] == toks[False]}", flush=True)
    write_result(res, args.out)


if __name__ == "__main__":
    main()
