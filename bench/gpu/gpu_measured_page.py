"""The book section of what was measured on a GPU (``book/_includes/gpu_measured_h100.md``), rendered from
three result files of one lease:

- ``bench/results/gpu_estimate_measured_<gpu>.json`` (``bench/gpu/gpu_estimate.py``, the two backbones merged
  with ``--from-json``): decode runs of the engine, HF ``generate``, the bare model's loop, engine against
  the static path with CUDA graphs, pretraining stages, and the estimate from the measured engine;
- ``bench/results/graph_check_h100.json`` (``bench/gpu/graph_check.py``): token equality in float32, and
  interleaved bf16 timing split into the step and the host loop;
- ``bench/results/graph_profile_h100.json`` (``bench/gpu/graph_profile.py --from-log``): the captured step's
  CUDA time per decode step before and after ``ctrls.generate.kv_cache.packed_sdpa_attention``.

    python bench/gpu/gpu_measured_page.py     # rewrites book/_includes/gpu_measured_h100.md
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpuest.models import SHAPES  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "bench" / "results"
SHORT = {"Qwen/Qwen2.5-3B-Instruct": "Qwen2.5-3B", "meta-llama/Llama-3.2-3B-Instruct": "Llama-3.2-3B"}
RUNS = (("base_b160", "ours, Base"), ("ctrls_b160", "ours, CTRLS"), ("hf_b160", "HF generate"),
        ("floor_b160", "bare model loop"), ("base_rl", "ours, Base"), ("ctrls_rl", "ours, CTRLS"),
        ("hf_rl", "HF generate"), ("floor_rl", "bare model loop"))


def _median_ms(rec: dict) -> float:
    t = rec.get("t_body") or []
    d = sorted(b - a for a, b in zip(t, t[1:]))
    return 1e3 * (d[len(d) // 2] if d else rec["s_per_iteration"])


def _runs(measured: dict, keys):
    """(backbone's short name, key, record) of each of ``keys`` a backbone measured without error, backbone
    by backbone."""
    for name, b in measured["backbones"].items():
        for key in keys:
            r = b.get(key)
            if r and "error" not in r:
                yield SHORT.get(name, name), key, r


def _commit(env: dict) -> str:
    return (env.get("git_commit") or "unknown")[:7]


def render(measured: dict, check: dict, prof: dict) -> str:
    env = measured["environment"]
    parts = [measured] + [{"environment": m["environment"]} for m in measured.get("merged_from", [])[1:]]
    commits = sorted({_commit(p["environment"]) for p in parts} | {_commit(check["environment"])}
                     | {c[:7] for c in prof.get("commits", {}).values()})
    out = [f"Measured on one **{env['gpu']}** (torch {env['torch']}, CUDA {env['cuda']}, transformers "
           f"{env['transformers']}, {env['cpu_count']} host cores), in bf16, on random-weight models of the two "
           f"backbones' full shapes (no weights downloaded; `bench/gpu/gpuest/models.py`), commits "
           f"{', '.join(commits)}. Result files: `bench/results/gpu_estimate_measured_*.json`, "
           "`graph_check_h100.json`, `graph_profile_h100.json`; this section is rendered from them by "
           "`python bench/gpu/gpu_measured_page.py`.", ""]

    # 1. the engine's decode rates
    out += ["**Decode rates of the engine** (every row decodes its full length; "
            "ms/it: the median decode iteration, prefill excluded; the bare model loop is the eager model with no "
            "sampling):", "",
            "| backbone | batch | sampler | tokens | tok/s | ms/it |", "|---|---|---|---:|---:|---:|"]
    labels = dict(RUNS)
    for name, key, r in _runs(measured, labels):
        toks = r.get("new_tokens", r.get("iterations"))
        tps = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else "–"
        out.append(f"| {name} | {r['rows']} rows | {labels[key]} | {toks} | {tps} | {_median_ms(r):.1f} |")
    out += ["", "The runs went one after another, and the host's speed moved between them (next table), so a row "
            "against another here (CTRLS against Base, say) compares moments of the machine, not samplers.", ""]

    # 2. interleaved timing: how much the host moves
    t = check["timing"]
    new = t["new_tokens"]
    out += [f"**The engine is host-bound, and the host's speed moved.** `bench/gpu/graph_check.py` ran, at 160 rows x "
            f"{new} tokens of {SHORT.get(check['backbone'], check['backbone'])}, the engine and the static path with "
            "CUDA graphs twice each, interleaved (ms per iteration; *inside*: the decoder body, or the captured step, "
            "timed with a synchronisation on either side):", "",
            "| run | ms/it | inside | host loop |", "|---|---:|---:|---:|"]
    for k in ("engine1", "graph1", "engine2", "graph2"):
        r = t[k]
        out.append(f"| {k[:-1]} ({k[-1]}) | {1e3 * r['s_per_iteration']:.1f} | {1e3 * r['inside_s'] / new:.1f} | "
                   f"{1e3 * r['host_loop_s'] / new:.1f} |")
    e1, e2, g1, g2 = (1e3 * t[k]["s_per_iteration"] for k in ("engine1", "engine2", "graph1", "graph2"))
    out += ["", f"The same engine run took {e1:.0f} and {e2:.0f} ms per iteration a minute apart, and the bare model's "
            "loop (above) is as slow as the sampler: the time is the host launching the eager model's kernels one "
            "by one on this machine's virtual CPUs, not the GPU (its kernels took about "
            f"{prof['runs']['repeat_kv']['engine']['self_cuda_ms_per_step']:.0f} ms per iteration, profiled below). "
            f"The captured runs took {g1:.1f} and {g2:.1f} ms. Ratios between the two paths on this machine are "
            "therefore ranges, not constants.", ""]

    # 3. engine vs graphs in the estimate's runs (before the packed attention)
    out += ["**Engine against the static path with CUDA graphs**, in `bench/gpu/gpu_estimate.py`'s runs (the same "
            "prompts and seeds; the static path's first run compiles and captures, the second is timed). These "
            "ran with the keys and values repeated per query head (the unpacked attention of the next paragraph):", "",
            "| backbone | run | engine tok/s | graphs tok/s | ratio | compile s |", "|---|---|---:|---:|---:|---:|"]
    for name, key, r in _runs(measured, ("graph_base_b160", "graph_ctrls_b160", "graph_ctrls_rl")):
        out.append(f"| {name} | {key[6:].replace('_', ', ')} ({r['rows']} rows) | "
                   f"{r['engine']['tokens_per_s']:,.0f} | {r['static']['tokens_per_s']:,.0f} | "
                   f"{r['speedup']:.2f}x | {r['static_first_run_seconds']:.0f} |")
    out.append("")

    # 4. the profile before / after
    pr = prof["runs"]
    before, after = pr["repeat_kv"]["static"], pr["packed"]["static"]

    def step_ms(p):
        return next(r["self_cuda_ms_per_step"] for r in p["rows"] if r["name"].startswith("## Call CompiledFxGraph"))

    def kernel(p, prefix):
        return sum(r["self_cuda_ms_per_step"] for r in p["rows"] if r["name"].startswith(prefix))

    rep = kernel(before, "triton_poi_fused__scaled_dot_product")
    shape = SHAPES[prof["backbone"]]
    heads, groups = shape["num_attention_heads"], shape["num_attention_heads"] // shape["num_key_value_heads"]
    att_b, att_a = kernel(before, "cudnn_generated"), kernel(after, "cudnn_generated")
    out += ["**Why the captured step is slow at 160 rows without packed attention.** The torch profiler "
            f"(`bench/gpu/graph_profile.py`, {prof['new_tokens']} tokens, 160 rows of "
            f"{SHORT.get(prof['backbone'], prof['backbone'])}) put the captured step at {step_ms(before):.1f} ms of "
            f"GPU time per token, {rep:.1f} ms of it in a copy feeding attention and {att_b:.1f} ms in cuDNN's "
            "attention. Under `torch.compile`, transformers repeats the keys and values of grouped-query attention "
            "once per query head (eagerly it packs the query onto the KV heads instead), so every layer copied the "
            f"whole static cache {groups} times over and attended over {heads} heads. "
            "`ctrls.generate.kv_cache.packed_sdpa_attention` packs the query in the compiled step too (the same arithmetic "
            "as the eager path; `tests/generate/test_static_decode.py` checks it against attention with repeated heads). "
            f"After it, the captured step took {step_ms(after):.1f} ms of GPU time per token (attention "
            f"{att_a:.1f} ms):", "",
            "| profiled run | ms/it | inside | GPU ms/it |", "|---|---:|---:|---:|"]
    for lab, title in (("repeat_kv", "before"), ("packed", "after")):
        for path in ("static", "engine"):
            p = pr[lab][path]
            out.append(f"| {title}: {'graphs' if path == 'static' else 'engine'} | {p['ms_per_iteration']:.1f} | "
                       f"{p['inside_ms_per_iteration']:.1f} | {p['self_cuda_ms_per_step']:.1f} |")
    sa, ea = pr["packed"]["static"]["ms_per_iteration"], pr["packed"]["engine"]["ms_per_iteration"]
    out += ["", f"Under the profiler (which slows the host of both), the captured path with packed attention ran at {sa:.1f} "
            f"ms per iteration against the engine's {ea:.1f} ms in the same run ({ea / sa:.1f}x). The end-to-end "
            "runs above and the hours below are of the unpacked attention; none was repeated with packed attention.", ""]

    # 5. equality
    eq = check["equality"]
    out += [f"**Equality** (`bench/gpu/graph_check.py`, {eq['dtype']}, {eq['prompts']} prompts x {eq['samples']} samples x "
            f"{eq['new_tokens']} tokens of {SHORT.get(check['backbone'], check['backbone'])}, seeded, the same "
            "streams): rows whose tokens are all equal, and the mean common prefix in tokens.", "",
            "| model | engine vs static | static vs graphs | graphs vs graphs again |", "|---|---:|---:|---:|"]
    for m in ("base", "ctrls"):
        c = eq[m]

        def cell(k):
            return f"{100 * c[k]['rows_equal_fraction']:.0f}% ({c[k]['mean_common_prefix']:.1f})"
        out.append(f"| {'Base' if m == 'base' else 'CTRLS'} | {cell('engine_vs_static')} | {cell('static_vs_graph1')} "
                   f"| {cell('graph1_vs_graph2')} |")
    rows = eq["prompts"] * eq["samples"]
    same = all(eq[m][k]["all_equal"] for m in ("base", "ctrls") for k in ("static_vs_graph1", "graph1_vs_graph2"))
    diff = {m: round((1 - eq[m]["engine_vs_static"]["rows_equal_fraction"]) * rows) for m in ("base", "ctrls")}
    bf16 = [r["mean_common_prefix"] for b in measured["backbones"].values() for k, r in b.items()
            if k.startswith("graph_") and "mean_common_prefix" in r]
    out += ["", ("The captured graphs gave exactly the eager static step's tokens, and two captured runs, each with "
                 "a fresh cache, repeated. " if same else "**The captured graphs did not repeat the eager static "
                 "step's tokens.** ")
            + f"Engine against static: {diff['base']} (Base) and {diff['ctrls']} (CTRLS) of {rows} rows diverged, "
            "through floating-point batch effects (the static path pads prompts to a multiple of 64 and attends "
            f"over its whole cache). In bf16 the estimate's runs shared at most {max(bf16):.1f} leading tokens on "
            "average: a random model's top-50 logits are near ties, so any rounding difference changes a draw.", ""]

    # 6. the hours
    est = measured["estimate"]
    proxies = [SHORT.get(n, n) for n, b in measured["backbones"].items() if b.get("ctrls_lockstep", {}).get("proxy_of")]
    out += ["**Hours from the measured engine** (the paper profile on one H100; the estimate's stages as in the "
            "analytic section, with the measured runs' per-iteration times):", "",
            "| stage | mean | cap |", "|---|---:|---:|"]
    for stage, h in est["stages_hours"].items():
        out.append(f"| {stage} | {h['mean']:.1f} | {h['cap']:.1f} |")
    tot = est["total_hours"]
    out.append(f"| **total** | **{tot['mean']:.1f}** | **{tot['cap']:.1f}** |")
    out += ["", f"The measured engine gives {tot['mean']:.1f}–{tot['cap']:.1f} H100-hours, against the analytic "
            "eager estimate above: the analytic model's 10 µs per launched op was optimistic for this machine's host. "
            + (f"No lockstep RL batch was measured for {', '.join(proxies)}: the 160-row CTRLS run stands in for "
               "it (more rows than the lockstep batch's 112; the engine's host loop grows with the rows, so an upper "
               "bound). " if proxies else "")
            + "The captured path's hours with packed attention were not measured end to end; the analytic static estimate "
            "stays labelled analytic.", ""]
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measured", default=str(RES / "gpu_estimate_measured_nvidia_h100_80gb_hbm3.json"))
    ap.add_argument("--check", default=str(RES / "graph_check_h100.json"))
    ap.add_argument("--profile", default=str(RES / "graph_profile_h100.json"))
    ap.add_argument("--out", default=str(ROOT / "book" / "_includes" / "gpu_measured_h100.md"))
    args = ap.parse_args(argv)
    text = render(*(json.loads(Path(p).read_text()) for p in (args.measured, args.check, args.profile)))
    Path(args.out).write_text(text + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
