"""The reproduce page's measured GPU-hours of the captured path (``book/_includes/gpu_measured_graph.md``),
rendered from one merged result of ``bench/gpu/gpu_estimate.py``: the library's ``sample()`` with the eager
engine against the static path captured as CUDA graphs, on the same prompts and seeds, at every batch the
``paper`` profile decodes (exploration's 160 rows, Base and CTRLS; an RL group of 8; RL training's lockstep
batch of every run's step), and the profile's hours from each path's measured rates.

Measured (two commands of one lease; the second adds the lockstep batch, merged by ``--from-json``)::

    python bench/gpu/gpu_estimate.py --backbones Qwen/Qwen2.5-3B-Instruct --no-cpu-full --skip-hf \\
        --new 256 --new-rl 256 -o 'grid.backbones=[Qwen/Qwen2.5-3B-Instruct]' --out qwen_graph.json
    python bench/gpu/gpu_estimate.py --backbones Qwen/Qwen2.5-3B-Instruct --no-cpu-full --skip-hf \\
        --new 256 --new-rl 256 --only graph_ctrls_lockstep -o 'grid.backbones=[Qwen/Qwen2.5-3B-Instruct]' \\
        --out qwen_lockstep.json
    python bench/gpu/gpu_estimate.py --from-json qwen_graph.json qwen_lockstep.json \\
        -o 'grid.backbones=[Qwen/Qwen2.5-3B-Instruct]' --out bench/results/gpu_estimate_measured_nvidia_h200_qwen.json
    python bench/gpu/gpu_graph_page.py       # rewrites book/_includes/gpu_measured_graph.md
"""
from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "gpu_estimate_measured_nvidia_h200_qwen.json"
RUNS = (("graph_base_b160", "exploration, Base"), ("graph_ctrls_b160", "exploration, CTRLS"),
        ("graph_ctrls_rl", "RL group / evaluation, CTRLS"), ("graph_ctrls_lockstep", "RL training lockstep, CTRLS"))


def _h(x: float) -> str:
    return f"{x:.1f}"


def render(d: dict) -> str:
    env, st = d["environment"], d["settings"]
    (name, b), = d["backbones"].items()
    eager, graph = d["estimate"], d["estimate_graph"]
    out = [f"Measured on one **{env['gpu']}** (torch {env['torch']}, CUDA {env['cuda']}, transformers "
           f"{env['transformers']}), bf16, a random-weight model of **{name}**'s full shape (no weights downloaded), "
           f"rows decoding {st['new']} tokens each (the hours extrapolate to longer chains with each run's last-quarter "
           f"slope), the LM head biased so a newline (a CoT step) comes about every {st['step_tokens']:.0f} tokens. "
           "Rendered from `bench/results/gpu_estimate_measured_nvidia_h200_qwen.json` by "
           "`python bench/gpu/gpu_graph_page.py` (its docstring holds the measuring commands).", "",
           "**The library's two decode paths, same prompts and seeds** (`sample()` with `decode: engine` against "
           "`decode: static, compile: reduce-overhead`; the static path is run once to compile and capture, then "
           "timed):", "",
           "| batch | rows | engine tok/s | captured tok/s | speedup | compile + capture + first run (s) |",
           "|---|---:|---:|---:|---:|---:|"]
    for key, label in RUNS:
        r = b.get(key)
        if not r or "static" not in r:
            out.append(f"| {label} | – | not measured | | | |")
            continue
        out.append(f"| {label} | {r['rows']} | {r['engine']['tokens_per_s']:,.0f} | {r['static']['tokens_per_s']:,.0f} "
                   f"| {r['speedup']:.2f}x | {r['static_first_run_seconds']:.0f} |")
    done = [b[k] for k, _ in RUNS if "static" in b.get(k, {})]
    equal = sum(r["rows_equal_fraction"] * r["rows"] for r in done)
    prefix = max(r["mean_common_prefix"] for r in done)
    out += ["", f"In bf16 the two paths' tokens part early ({equal:.0f} of {sum(r['rows'] for r in done)} rows equal "
            f"throughout; common prefix {prefix:.1f} tokens on average at most): the captured kernels round "
            "differently from the eager ones and sampling amplifies it. In float32 the captured step computes the "
            "eager step's tokens exactly (`bench/gpu/graph_check.py`, section 'Measured on an H100').", "",
            "**Hours of the `paper` profile for this backbone** (GSM8K and MATH, every stage but the API-bound judge; "
            "one GPU; 'mean': every batch decodes the assumed mean chain length, 'cap': max_new_tokens), from each "
            "path's measured rates:", "",
            "| stage | engine, mean | engine, cap | captured, mean | captured, cap |", "|---|---:|---:|---:|---:|"]
    for stage, e in eager["stages_hours"].items():
        g = graph["stages_hours"][stage]
        out.append(f"| {stage} | {_h(e['mean'])} | {_h(e['cap'])} | {_h(g['mean'])} | {_h(g['cap'])} |")
    te, tg = eager["total_hours"], graph["total_hours"]
    out.append(f"| **total** | **{_h(te['mean'])}** | **{_h(te['cap'])}** | **{_h(tg['mean'])}** | **{_h(tg['cap'])}** |")
    out += ["", headline(d)]
    return "\n".join(out)


def headline(d: dict) -> str:
    """The page's one-paragraph answer: one backbone's hours on the captured path, and what an H100 would take."""
    env = d["environment"]
    te, tg = d["estimate"]["total_hours"], d["estimate_graph"]["total_hours"]
    (name,) = d["backbones"]
    gpu = env["gpu"].replace("NVIDIA ", "")
    return (f"One backbone's `paper` profile ({name}, GSM8K and MATH, judge excluded) with its decode steps captured as "
            "CUDA graphs, from rates measured at every batch size the profile decodes: "
            f"**{_h(tg['mean'])}-{_h(tg['cap'])} {gpu}-hours**, against {_h(te['mean'])}-{_h(te['cap'])} h with the "
            "eager engine on the same machine. An H200 reads memory about 1.4x faster than an H100 (4.8 against 3.35 TB/s, spec "
            "sheets), and decoding a 3B model is bound by that read, so on an H100 expect up to about 1.4x these "
            "hours (an expectation, not a measurement on an H100).")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--result", default=str(RESULT))
    ap.add_argument("--out", default=str(ROOT / "book" / "_includes" / "gpu_measured_graph.md"))
    ap.add_argument("--headline", default=str(ROOT / "book" / "_includes" / "gpu_headline.md"))
    args = ap.parse_args(argv)
    from ctrls.report.stored import read

    d = read(args.result, "gpu")  # the pages' one reader of this result: finite hours, mean <= cap, each refusal naming its field
    text = render(d)
    Path(args.out).write_text(text + "\n")
    Path(args.headline).write_text(headline(d) + "\n")
    print(text)


if __name__ == "__main__":
    main()
