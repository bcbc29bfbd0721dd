"""The engine's decode under the state prompt (``ctrls.generate.conditioning.StatePromptConditioning``) with
ragged passes (``ctrls.generate.ragged``: only the real slots through the model's linear layers) against the
padded rectangle they replaced, and the engine's Base decode of the same prompts beside them, in one run.

The demo's decode (``common.demo_decode``: SmolLM2-135M-Instruct in fp32, 32 word-problem questions x 4
samples = 128 rows, 80 tokens, 8 steps, eta = 0.7), every step under a state drawn by a random CTRLS
model's policy from each question's seed, m = 2 vectors per state initialised as the stage's fit starts them (not fitted: the
speed does not depend on the vectors' values). Each row samples from its own counter-based stream,
so the two decodes draw the same tokens unless float rounding moves a draw; ``tokens_equal_fraction``
is the share of rows whose tokens are equal. ``--rounds`` alternating rounds; the faster of each kept.
Usage: python bench/state_prompt_decode.py [--out bench/results/state_prompt_decode.json] [--rounds 2]
"""
from __future__ import annotations

import argparse
import contextlib
import time
from unittest import mock

import torch
from common import demo_decode, machine, timed_decode, write_result

K, M = 4, 2  # the demo's states and the stage's vectors per state


def decode(bb, prompts, params, ragged: bool) -> tuple[float, list]:
    """(seconds, tokens) of the engine's decode of ``prompts`` under the state prompt, 4 samples each."""
    import ctrls.generate.ragged as rg
    from ctrls.generate.conditioning import StatePromptConditioning
    from ctrls.generate.sampling import sample
    from ctrls.method.model import CTRLSModel
    from ctrls.method.state_prompt import StatePrompt

    model = CTRLSModel.random(bb.hidden_size, K, 2, 8, 0, centroid_scale=0.5, concentration=5.0)
    sp = StatePrompt(K, M, bb.model.get_input_embeddings().weight.detach(), seed=0)
    with mock.patch.object(rg, "supports_ragged", rg.supports_ragged if ragged else (lambda lm: False)):
        t = time.perf_counter()
        out = sample(bb, prompts, 4, params, seeds=list(range(len(prompts))),
                     conditioning=StatePromptConditioning(model, sp))
        return time.perf_counter() - t, [g.token_ids for gs in out for g in gs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    bb, prompts, params = demo_decode()
    times: dict[str, list[float]] = {"padded": [], "ragged": [], "engine_base": []}
    toks = {}
    with torch.no_grad():
        for r in range(args.rounds):
            for mode in ("padded", "ragged", "engine_base") if r % 2 == 0 else ("engine_base", "ragged", "padded"):
                if mode == "engine_base":
                    s, toks[mode] = timed_decode(bb, prompts, params, contextlib.nullcontext())
                else:
                    s, toks[mode] = decode(bb, prompts, params, mode == "ragged")
                times[mode].append(s)
                print(f"round {r} {mode}: {s:.1f} s", flush=True)
    best = {k: min(v) for k, v in times.items()}
    res = {"ragged_speedup": best["padded"] / best["ragged"], "ragged_over_engine": best["ragged"] / best["engine_base"],
           "tokens_equal_fraction": sum(a == b for a, b in zip(toks["ragged"], toks["padded"])) / len(toks["ragged"]),
           "rows": len(toks["ragged"]), "tokens": {k: sum(map(len, v)) for k, v in toks.items()},
           "seconds": best, "runs_seconds": times,
           "decode": {"backbone": "smollm2-135m-instruct", "dtype": "float32", "questions": len(prompts), "samples": 4,
                      "max_new_tokens": params.max_new_tokens, "max_steps": params.max_steps, "states": K, "vectors": M},
           "command": "python bench/state_prompt_decode.py --out bench/results/state_prompt_decode.json",
           "machine": machine()}
    write_result(res, args.out)


if __name__ == "__main__":
    main()
