"""What a token of the state prompt's fit costs: a forward and backward pass through the frozen
backbone (gradients to the input embeddings only, as ``ctrls.method.state_prompt.fit`` takes them), per
token, at several numbers of tokens in one pass. If the cost per token falls as more tokens go through
together, packing chains into one pass would shorten the fit; if it is flat, the fit is bound by
arithmetic and only fewer token passes would.

SmolLM2-135M-Instruct in fp32, inputs_embeds of 100 to 800 random vectors, the LM head and a
log-softmax on every position (``full``) and the decoder body alone (``body``); the best of 3 repeats each.
Usage: python bench/state_prompt_fit.py [--out bench/results/state_prompt_fit.json]
"""
from __future__ import annotations

import argparse
import time

import torch
from common import machine, write_result

TOKENS = (100, 200, 400, 800)


def per_token_ms(fn, x: torch.Tensor, repeats: int = 3) -> float:
    """The best of ``repeats`` forward-and-backward passes of ``fn`` on ``x``, in milliseconds a token."""
    best = float("inf")
    for _ in range(repeats):
        x.grad = None
        t = time.perf_counter()
        fn(x).backward()
        best = min(best, time.perf_counter() - t)
    return best / x.shape[1] * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from ctrls.method.backbone import load_backbone

    lm = load_backbone("smollm2-135m-instruct", device="cpu", dtype="float32").model
    for p in lm.parameters():
        p.requires_grad_(False)  # frozen: no weight gradients, as in the fit

    def full(x):
        return lm(inputs_embeds=x).logits.float().log_softmax(-1)[0, :, 0].sum()

    def body(x):
        return lm.model(inputs_embeds=x).last_hidden_state.sum()

    g = torch.Generator().manual_seed(0)
    rows = []
    for n in TOKENS:
        x = torch.randn((1, n, lm.config.hidden_size), generator=g).requires_grad_(True)
        rows.append({"tokens": n, "full_ms_per_token": per_token_ms(full, x), "body_ms_per_token": per_token_ms(body, x)})
        print(rows[-1], flush=True)
    full_ms = [r["full_ms_per_token"] for r in rows]
    res = {"per_token": rows, "full_800_over_100": full_ms[-1] / full_ms[0],
           "backbone": "smollm2-135m-instruct", "dtype": "float32",
           "command": "python bench/state_prompt_fit.py --out bench/results/state_prompt_fit.json", "machine": machine()}
    write_result(res, args.out)


if __name__ == "__main__":
    main()
