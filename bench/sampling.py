"""The sampling engine against HF ``generate`` and against the CPU's matmul limit (SmolLM2-135M).

1. CTRLS-guided sampling vs HF ``generate`` (tokens/s), same model, batch and forced length.
2. Base, 20 samples per question with prefix sharing vs ``generate(num_return_sequences=20)``
   on a 4-shot prompt.
3. The matmul limit: measured 2048^2 GEMM GFLOP/s (fp32, bf16), 2 x parameters FLOPs per token,
   and the fraction of the matmul-bound tokens/s that the engine reaches at batch 128.
4. Ops and host synchronisations per decode iteration and per generated token, Base and CTRLS
   (``dispatch_counts``): aten ops counted with a ``TorchDispatchMode`` ('kernel': would launch a
   kernel on a GPU; 'view': views and allocations), host syncs = ``aten::_local_scalar_dense``
   (``bool()``/``item()`` of a tensor) + ``Tensor.cpu()`` calls (a device-to-host copy on a GPU), over
   the decode iterations ``--count-from`` .. ``--count-to`` (two runs with the same seeds, the
   difference of their counts: the prefill and the first state draw cancel).
5. The goals, measured side by side in one run: CTRLS / Base tokens/s (goal >= 0.95) and Base / the
   fp32 matmul-bound limit (goal >= 0.40).
6. The static-shape path (``SampleParams(decode="static")``) against the engine, side by
   side in this run (fp32 only; ``--no-static`` skips it), keys ``*_static_*``:
   - forced length at the batch above, Base and CTRLS, eager: tokens/s ratios static / engine;
   - the same, with the static step compiled (``torch.compile``, inductor default mode): the
     steady-state ratio (a second run) and the compile seconds of the first run;
   - the demo's own decode: 32 word-problem questions x 4 samples (128 rows, the demo's
     ``sampling.batch_size``) with its 1-shot chat prompt, eta = 0.7, rows ending at EOS / the answer
     line / 80 tokens: static eager / engine, and whether every sample's tokens are equal.
The last line is a JSON object of the ratios and counts. Usage: python bench/sampling.py [--dtype float32|bfloat16|both]
"""
import argparse
import os
import time
from dataclasses import replace

import torch
from common import QUESTIONS, CpuCopyCounter, DispatchCounter, forced_params, gemm_gflops, random_ctrls, write_result

from ctrls.data.prompts import prompt_ids
from ctrls.generate.sampling import SampleParams, sample, seeded
from ctrls.method.backbone import load_backbone
from ctrls.report.provenance import cpu_model


def hf_generate(bb, prompts, new, n=1):
    tok = bb.tokenizer
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": prompts}, return_tensors="pt")
    t = time.perf_counter()
    bb.model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=True, top_k=50, temperature=0.7,
                      num_return_sequences=n, pad_token_id=tok.pad_token_id)
    return len(prompts) * n * new / (time.perf_counter() - t)


def ours(bb, prompts, new, n=1, model=None, share=True, **path):
    p = replace(forced_params(len(prompts) * n, new), **path)
    t = time.perf_counter()
    sample(bb, prompts, n, p, model=model, generator=seeded(0), share_prefix=share)
    return len(prompts) * n * new / (time.perf_counter() - t)


def static_vs_engine(bb, prompts, new, model, engine_base, engine_ctrls):
    """Item 6 of the module docstring: the static path's ratios to the engine's rates measured in this run."""
    from ctrls.config.schema import load_config
    from ctrls.data.problems import load_problems

    res = {}
    res["static_over_engine_base"] = ours(bb, prompts, new, decode="static") / engine_base
    res["static_over_engine_ctrls"] = ours(bb, prompts, new, model=model, decode="static") / engine_ctrls
    t = time.perf_counter()
    ours(bb, prompts, new, decode="static", compile="default")  # compiles (one shape: no row ends early)
    res["static_compile_seconds"] = time.perf_counter() - t
    res["static_compiled_over_engine_base"] = ours(bb, prompts, new, decode="static", compile="default") / engine_base
    cfg = load_config("demo")
    probs = load_problems("word_problems", "test", 32, seed=0, difficulty=cfg.data.word_problems.difficulty())
    demo = [prompt_ids(bb.tokenizer, q.question, True, cfg.prompt.few_shot) for q in probs]
    p = SampleParams(temperature=0.7, top_k=cfg.sampling.top_k, max_new_tokens=cfg.sampling.max_new_tokens,
                     max_steps=cfg.prompt.max_steps, batch_size=cfg.sampling.batch_size)
    runs = {}
    for path in ("engine", "static"):
        t = time.perf_counter()
        gens = sample(bb, demo, 4, replace(p, decode=path), seeds=list(range(len(demo))))
        runs[path] = (gens, time.perf_counter() - t)
    tokens = {k: [g.token_ids for gs in v[0] for g in gs] for k, v in runs.items()}
    n_tok = sum(len(t) for t in tokens["engine"])
    res["static_demo_over_engine"] = runs["engine"][1] / runs["static"][1]
    res["static_demo_tokens_equal"] = tokens["engine"] == tokens["static"]
    res["static_demo_engine_tok_s"] = n_tok / runs["engine"][1]
    res["static_demo_rows"] = len(tokens["engine"])
    res["static_demo_mean_tokens"] = n_tok / len(tokens["engine"])
    return res


def dispatch_counts(bb, prompts, n, model, lo, hi):
    """Ops and host syncs per decode iteration and per generated token over iterations lo .. hi
    (module docstring, item 4)."""
    res = []
    for new in (lo, hi):
        p = forced_params(len(prompts) * n, new)
        with torch.no_grad(), DispatchCounter() as d, CpuCopyCounter(d.counts):
            gens = sample(bb, prompts, n, p, model=model, seeds=list(range(len(prompts))))
        states = sum(len(g.states) for gs in gens for g in gs) if model is not None else 0
        res.append((dict(d.counts), states))
    rows, iters = len(prompts) * n, hi - lo
    diff = {k: res[1][0][k] - res[0][0][k] for k in res[0][0]}
    per_it = {"kernel_ops": diff["kernel"] / iters, "all_ops": (diff["kernel"] + diff["view"] + diff["sync"]) / iters,
              "host_syncs": (diff["sync"] + diff["cpu_copy"]) / iters}
    out = {"rows": rows, "iterations": [lo, hi], "per_iteration": per_it,
           "per_token": {k: v / rows for k, v in per_it.items()}}
    if model is not None:
        out["state_redraws_per_iteration"] = (res[1][1] - res[0][1]) / iters
    return out


def run(dtype, batch=128, new=48, count=(8, 24), static=True):
    bb = load_backbone("smollm2-135m-instruct", dtype=dtype)
    tok = bb.tokenizer
    n_params = sum(p.numel() for p in bb.model.parameters())
    short = [tok(q)["input_ids"] for q in QUESTIONS[:4]]
    prompts = [short[i % len(short)] for i in range(batch)]
    ours(bb, prompts[:4], 4)  # warm-up
    res = {}
    m = random_ctrls(bb)
    res["hf"] = hf_generate(bb, prompts, new)
    res["base"] = ours(bb, prompts, new)
    res["ctrls"] = ours(bb, prompts, new, model=m)
    few = [prompt_ids(tok, q, use_chat_template=False, few_shot=4) for q in QUESTIONS[:4]]
    res["hf_nrs20"] = hf_generate(bb, few, new, n=20)
    res["base_shared20"] = ours(bb, few, new, n=20)
    gf = gemm_gflops(getattr(torch, dtype))
    limit = gf * 1e9 / (2 * n_params)
    st = static_vs_engine(bb, prompts, new, m, res["base"], res["ctrls"]) if static else {}
    counts = {}
    if count:
        for label, mm in (("base", None), ("ctrls", m)):
            counts[label] = dispatch_counts(bb, short, 4, mm, *count)
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
    ratio, frac = res["ctrls"] / res["base"], res["base"] / limit
    print(f"  goals (side by side, this run): CTRLS / Base = {ratio:.2f}x (goal >= 0.95: "
          f"{'met' if ratio >= 0.95 else 'NOT met'}); Base = {frac:.0%} of the matmul-bound limit (goal >= 40%: "
          f"{'met' if frac >= 0.40 else 'NOT met'})")
    if st:
        print(f"  static path / engine, forced length, batch {batch}: Base {st['static_over_engine_base']:.2f}x, "
              f"CTRLS {st['static_over_engine_ctrls']:.2f}x (eager); compiled Base {st['static_compiled_over_engine_base']:.2f}x "
              f"after a {st['static_compile_seconds']:.0f} s first run (goal >= 1.5x)")
        print(f"  static path / engine, the demo's decode ({st['static_demo_rows']} rows, mean "
              f"{st['static_demo_mean_tokens']:.0f} tokens, engine {st['static_demo_engine_tok_s']:.0f} tok/s): "
              f"{st['static_demo_over_engine']:.2f}x; tokens equal: {st['static_demo_tokens_equal']}")
    for label, c in counts.items():
        it, tk = c["per_iteration"], c["per_token"]
        extra = (f", {c['state_redraws_per_iteration']:.2f} state redraws per iteration"
                 if "state_redraws_per_iteration" in c else "")
        print(f"  {label:5s} per decode iteration ({c['rows']} rows, iterations {c['iterations'][0]}-{c['iterations'][1]}): "
              f"{it['kernel_ops']:.0f} kernel ops ({it['all_ops']:.0f} all), {it['host_syncs']:.1f} host syncs; "
              f"per generated token {tk['kernel_ops']:.1f} kernel ops, {tk['host_syncs']:.2f} host syncs{extra}")
    return {f"{dtype}_ctrls_over_base": round(ratio, 3), f"{dtype}_base_fraction_of_limit": round(frac, 3),
            f"{dtype}_base_tok_s": round(res["base"], 1), f"{dtype}_ctrls_tok_s": round(res["ctrls"], 1),
            f"{dtype}_ops": counts,
            f"{dtype}_ctrls_over_generate": round(res["ctrls"] / res["hf"], 2),
            f"{dtype}_shared20_over_generate": round(res["base_shared20"] / res["hf_nrs20"], 2),
            f"{dtype}_gemm_gflops": round(gf, 1), f"{dtype}_fraction_of_limit_base": round(res["base"] / limit, 3),
            f"{dtype}_fraction_of_limit_ctrls": round(res["ctrls"] / limit, 3),
            **{f"{dtype}_{k}": round(v, 3) if isinstance(v, float) else v for k, v in st.items()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="both", choices=["float32", "bfloat16", "both"])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--count-from", type=int, default=8, help="op counts: first decode iteration counted")
    ap.add_argument("--count-to", type=int, default=24, help="op counts: decode iterations counted up to here")
    ap.add_argument("--no-static", action="store_true", help="skip item 6 (the static path against the engine)")
    ap.add_argument("--out", help="also write the JSON object here")
    a = ap.parse_args()
    out = {"torch_threads": torch.get_num_threads(), "load_average": list(os.getloadavg()), "cpus": os.cpu_count(),
           "cpu": cpu_model(), "torch": torch.__version__}
    for dt in (["float32", "bfloat16"] if a.dtype == "both" else [a.dtype]):
        out.update(run(dt, a.batch, a.new if dt == "float32" else min(a.new, 16),
                       (a.count_from, a.count_to) if dt == "float32" else None, dt == "float32" and not a.no_static))
    write_result(out, a.out)  # printed as the last line; written whole or not at all, never with a NaN


if __name__ == "__main__":
    main()
