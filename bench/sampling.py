"""The sampling engine against HF ``generate`` and against the CPU's matmul limit (SmolLM2-135M).

1. CTRLS-guided sampling vs HF ``generate`` (tokens/s), same model, batch and forced length.
2. Base, 20 samples per question with prefix sharing vs ``generate(num_return_sequences=20)``
   on a 4-shot prompt.
3. The matmul limit: measured 2048^2 GEMM GFLOP/s (fp32, bf16), 2 x parameters FLOPs per token,
   and the fraction of the matmul-bound tokens/s that the engine reaches at batch 128.
The last line is a JSON object of the ratios. Usage: python bench/sampling.py [--dtype float32|bfloat16|both]
"""
import argparse
import json
import time

import torch

from ctrls.backbone import load_backbone
from ctrls.model import CTRLSConfig, CTRLSModel
from ctrls.prompts import prompt_ids
from ctrls.sampling import SampleParams, sample, seeded

QUESTIONS = ["A farmer has 17 sheep and buys 3 times as many goats. How many animals does he have?",
             "A book costs $12 and a pen costs $3. How much do 4 books and 5 pens cost?",
             "Sam reads 25 pages a day. How many days does he need for a 300-page book?",
             "A tank holds 120 liters and leaks 4 liters an hour. How much is left after 9 hours?"]


def gemm_gflops(dtype, n=2048, reps=3):
    a = torch.randn(n, n, dtype=dtype)
    a @ a
    t = time.perf_counter()
    for _ in range(reps):
        a @ a
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def random_ctrls(bb, K=16, k=4):
    torch.manual_seed(0)
    d = bb.hidden_size
    conf = CTRLSConfig(hidden_size=d, n_states=K, requested_states=K, spectral_k=k, spectral_normalize=True, tau=50.0, rank=64)
    m = CTRLSModel.build(conf, torch.randn(K, k * d), L=torch.randn(K, K))
    torch.nn.init.normal_(m.adapter.up.weight, std=0.01)
    return m.to(bb.device)


def hf_generate(bb, prompts, new, n=1):
    tok = bb.tokenizer
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": prompts}, return_tensors="pt")
    t = time.perf_counter()
    bb.model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=True, top_k=50, temperature=0.7,
                      num_return_sequences=n, pad_token_id=tok.pad_token_id)
    return len(prompts) * n * new / (time.perf_counter() - t)


def ours(bb, prompts, new, n=1, model=None, share=True):
    p = SampleParams(temperature=0.7, top_k=50, max_new_tokens=new, max_steps=10**6, stop_at_answer=False,
                     ignore_eos=True, batch_size=len(prompts) * n, epsilon=0.1)
    t = time.perf_counter()
    sample(bb, prompts, n, p, model=model, generator=seeded(0), share_prefix=share)
    return len(prompts) * n * new / (time.perf_counter() - t)


def run(dtype, batch=128, new=48):
    bb = load_backbone("smollm2-135m-instruct", dtype=dtype)
    tok = bb.tokenizer
    n_params = sum(p.numel() for p in bb.model.parameters())
    short = [tok(q)["input_ids"] for q in QUESTIONS]
    prompts = [short[i % len(short)] for i in range(batch)]
    ours(bb, prompts[:4], 4)  # warm-up
    res = {}
    m = random_ctrls(bb)
    res["hf"] = hf_generate(bb, prompts, new)
    res["base"] = ours(bb, prompts, new)
    res["ctrls"] = ours(bb, prompts, new, model=m)
    few = [prompt_ids(tok, q, use_chat_template=False, few_shot=4) for q in QUESTIONS]
    res["hf_nrs20"] = hf_generate(bb, few, new, n=20)
    res["base_shared20"] = ours(bb, few, new, n=20)
    gf = gemm_gflops(getattr(torch, dtype))
    limit = gf * 1e9 / (2 * n_params)
    print(f"\n[{dtype}] SmolLM2-135M ({n_params / 1e6:.0f}M parameters: {2 * n_params / 1e9:.2f} GFLOP per token), "
          f"batch {batch}, {new} forced tokens, {torch.get_num_threads()} threads")
    print(f"  2048^2 GEMM: {gf:.0f} GFLOP/s -> matmul-bound limit {limit:.0f} tokens/s")
    print(f"  HF generate            {res['hf']:8.1f} tok/s   ({res['hf'] / limit:.0%} of the limit)")
    print(f"  ours, Base             {res['base']:8.1f} tok/s   ({res['base'] / limit:.0%} of the limit)")
    print(f"  ours, CTRLS (eps=0.1)  {res['ctrls']:8.1f} tok/s   ({res['ctrls'] / limit:.0%} of the limit)"
          f"   CTRLS / HF generate = {res['ctrls'] / res['hf']:.2f}x")
    print(f"  4-shot prompt ({len(few[0])} tokens), 4 questions x 20 samples:")
    print(f"    generate(num_return_sequences=20) {res['hf_nrs20']:8.1f} tok/s")
    print(f"    ours with prefix sharing          {res['base_shared20']:8.1f} tok/s   "
          f"({res['base_shared20'] / res['hf_nrs20']:.2f}x)")
    return {f"{dtype}_ctrls_over_generate": round(res["ctrls"] / res["hf"], 2),
            f"{dtype}_shared20_over_generate": round(res["base_shared20"] / res["hf_nrs20"], 2),
            f"{dtype}_gemm_gflops": round(gf, 1), f"{dtype}_fraction_of_limit_base": round(res["base"] / limit, 3),
            f"{dtype}_fraction_of_limit_ctrls": round(res["ctrls"] / limit, 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="both", choices=["float32", "bfloat16", "both"])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--new", type=int, default=48)
    a = ap.parse_args()
    out = {}
    for dt in (["float32", "bfloat16"] if a.dtype == "both" else [a.dtype]):
        out.update(run(dt, a.batch, a.new if dt == "float32" else min(a.new, 16)))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
