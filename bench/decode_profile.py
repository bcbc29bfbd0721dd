"""Where a decode iteration's time goes on this CPU, and what a compiled static-shape step buys at the
demo's sizes.

SmolLM2-135M-Instruct, fp32, the demo's prompt length (a one-exemplar word-problem prompt) and batch.

1. **Profile of the engine** (``ctrls.generate.sampling.sample``, Base and CTRLS, forced length): the self CPU
   time of every aten op under ``torch.profiler``, grouped as
   - GEMM (``mm``, ``addmm``, ``bmm``, ``linear``, ``matmul``): the work the matmul-bound limit counts;
   - attention (the SDPA kernels);
   - other ops (norms, rotary, activations, cache writes, masks, sampling);
   - host (the rest of the wall time: Python, the module tree, the per-row bookkeeping);
   as shares of the decode loop's wall time (prefill excluded: the difference of two runs of
   ``--new`` and ``2 * --new`` tokens). Beside it: the GEMM rate this CPU reaches on a 2048^2
   product, and the fraction of the fp32 matmul-bound tokens/s the engine reaches.
2. **Static step, eager vs ``torch.compile``**: transformers' ``StaticCache`` with the model's forward,
   one token per row at a fixed batch and capacity, run eagerly and compiled (inductor, default
   mode); seconds per step for each, the compile time, and the break-even: decode steps needed for
   the compiled step to repay its compilation. Beside it, the engine's seconds per step at the same
   batch and context (item 1), so the three are measured side by side in one run.
3. **Token identity**: greedy tokens of the compiled static step equal the eager static step's.

The last line printed is a JSON object; ``--out`` writes it too (with the machine).
Usage: python bench/decode_profile.py [--batch 16] [--new 32] [--out bench/results/decode_profile.json]
"""
from __future__ import annotations

import argparse
import time

import torch
from common import forced_params, gemm_gflops, machine, random_ctrls, write_result

from ctrls.data.prompts import prompt_ids
from ctrls.generate.sampling import sample, seeded
from ctrls.method.backbone import load_backbone

GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul", "aten::_mkl_linear"}
ATTN_PREFIX = ("aten::_scaled_dot_product", "aten::scaled_dot_product")


def demo_prompt(bb) -> list[int]:
    from ctrls.config.schema import load_config
    from ctrls.data.problems import load_problems

    cfg = load_config("demo")
    probs = load_problems("word_problems", "test", 1, seed=0, difficulty=cfg.data.word_problems.difficulty())
    return prompt_ids(bb.tokenizer, probs[0].question, True, cfg.prompt.few_shot)


def engine_run(bb, prompt, batch, new, model):
    p = forced_params(batch, new)
    t = time.perf_counter()
    sample(bb, [prompt], batch, p, model=model, generator=seeded(0))
    return time.perf_counter() - t


def profile_engine(bb, prompt, batch, new, model) -> dict:
    """Op-group shares of the decode loop: the profile of a (2 new)-token run minus a (new)-token run."""
    from torch.profiler import ProfilerActivity, profile

    def groups(n):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            wall = engine_run(bb, prompt, batch, n, model)
        g = {"gemm": 0.0, "attention": 0.0, "other ops": 0.0}
        for e in prof.key_averages():
            s = e.self_cpu_time_total / 1e6
            if e.key in GEMM:
                g["gemm"] += s
            elif e.key.startswith(ATTN_PREFIX):
                g["attention"] += s
            elif e.key.startswith("aten::"):
                g["other ops"] += s
        return wall, g

    engine_run(bb, prompt, batch, 4, model)  # warm-up
    w1, g1 = groups(new)
    w2, g2 = groups(2 * new)
    wall = w2 - w1
    d = {k: g2[k] - g1[k] for k in g1}
    d["host"] = wall - sum(d.values())
    # the unprofiled rate (the profiler's own overhead inflates the host share above)
    plain = engine_run(bb, prompt, batch, 2 * new, model) - engine_run(bb, prompt, batch, new, model)
    return {"seconds_per_step_profiled": wall / new, "seconds_per_step": plain / new,
            "shares": {k: v / wall for k, v in d.items()}}


def static_steps(bb, prompt, batch, new, compiled: bool):
    """(tokens, seconds per step after the first step, seconds of the first step) of greedy decoding
    with a StaticCache, eager or compiled."""
    from transformers import StaticCache

    lm = bb.model
    P = len(prompt)
    cache = StaticCache(config=lm.config, max_cache_len=P + new + 1)
    fwd = torch.compile(lm.forward, dynamic=False) if compiled else lm.forward
    ids = torch.tensor([prompt] * batch)
    with torch.inference_mode():
        out = lm(input_ids=ids, past_key_values=cache, cache_position=torch.arange(P), use_cache=True)
        tok = out.logits[:, -1].argmax(-1)
        toks = [tok]
        t0 = time.perf_counter()
        first = None
        for i in range(new - 1):
            pos = torch.tensor([P + i])
            out = fwd(input_ids=tok[:, None], past_key_values=cache, cache_position=pos,
                      position_ids=pos.expand(batch, 1), use_cache=True)
            tok = out.logits[:, -1].argmax(-1)
            toks.append(tok)
            if first is None:
                first = time.perf_counter() - t0
                t1 = time.perf_counter()
        rest = (time.perf_counter() - t1) / max(new - 2, 1)
    return torch.stack(toks, 1), rest, first


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16, help="rows decoded together (demo: 4 samples x 4 prompts)")
    ap.add_argument("--new", type=int, default=32, help="decode steps measured")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    bb = load_backbone("smollm2-135m-instruct", device="cpu", dtype="float32")
    prompt = demo_prompt(bb)
    n_params = sum(p.numel() for p in bb.model.parameters())
    gflops = gemm_gflops(torch.float32)
    limit = gflops * 1e9 / (2 * n_params)  # tokens/s if every FLOP ran at the GEMM rate
    res = {"machine": machine(), "prompt_tokens": len(prompt), "batch": args.batch, "new": args.new,
           "gemm_gflops_fp32": gflops, "matmul_bound_tokens_per_s": limit}
    for name, model in [("base", None), ("ctrls", random_ctrls(bb))]:
        r = profile_engine(bb, prompt, args.batch, args.new, model)
        r["fraction_of_limit"] = args.batch / r["seconds_per_step"] / limit
        res[f"engine_{name}"] = r
        print(f"engine {name}: {r['seconds_per_step'] * 1e3:.1f} ms/step at batch {args.batch} "
              f"({r['fraction_of_limit']:.0%} of the fp32 matmul-bound limit); shares of the profiled step: "
              + ", ".join(f"{k} {v:.0%}" for k, v in r["shares"].items()), flush=True)
    toks_e, eager, _ = static_steps(bb, prompt, args.batch, args.new, compiled=False)
    t = time.perf_counter()
    toks_c, comp, first = static_steps(bb, prompt, args.batch, args.new, compiled=True)
    compile_s = first  # the first compiled call compiles
    gain = eager - comp
    res["static"] = {"eager_seconds_per_step": eager, "compiled_seconds_per_step": comp,
                     "compile_seconds": compile_s, "static_compiled_over_eager_speed": eager / comp,
                     "static_eager_over_engine_speed": res["engine_base"]["seconds_per_step"] / eager,
                     "static_compiled_over_engine_speed": res["engine_base"]["seconds_per_step"] / comp,
                     "break_even_steps": compile_s / gain if gain > 0 else None,
                     "greedy_tokens_equal": bool(torch.equal(toks_e, toks_c)),
                     "wall_seconds": time.perf_counter() - t}
    s = res["static"]
    print(f"static step: eager {eager * 1e3:.1f} ms, compiled {comp * 1e3:.1f} ms "
          f"({s['static_compiled_over_eager_speed']:.2f}x), engine {res['engine_base']['seconds_per_step'] * 1e3:.1f} ms; "
          f"compile {compile_s:.0f} s; break-even after "
          + (f"{s['break_even_steps']:.0f} steps" if s["break_even_steps"] else "never (no gain)")
          + f"; greedy tokens equal: {s['greedy_tokens_equal']}", flush=True)
    write_result(res, args.out)


if __name__ == "__main__":
    main()
