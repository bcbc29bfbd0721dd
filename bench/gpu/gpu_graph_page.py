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

from ctrls.report.words import say

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
    out = [say("gpu_graph", "intro", gpu=env["gpu"], torch=env["torch"], cuda=env["cuda"], transformers=env["transformers"],
               name=name, new=st["new"], step_tokens=format(st["step_tokens"], ".0f"))]
    for key, label in RUNS:
        r = b.get(key)
        if not r or "static" not in r:
            out.append(say("gpu_graph", "row.missing", label=label))
            continue
        out.append("| " + " | ".join((label, str(r["rows"]), format(r["engine"]["tokens_per_s"], ",.0f"),
                                      format(r["static"]["tokens_per_s"], ",.0f"), format(r["speedup"], ".2f") + "x",
                                      format(r["static_first_run_seconds"], ".0f"))) + " |")
    done = [b[k] for k, _ in RUNS if "static" in b.get(k, {})]
    out += ["", say("gpu_graph", "equality", equal=format(sum(r["rows_equal_fraction"] * r["rows"] for r in done), ".0f"),
                   rows=sum(r["rows"] for r in done), prefix=format(max(r["mean_common_prefix"] for r in done), ".1f"))]
    for stage, e in eager["stages_hours"].items():
        g = graph["stages_hours"][stage]
        out.append("| " + " | ".join((stage, _h(e["mean"]), _h(e["cap"]), _h(g["mean"]), _h(g["cap"]))) + " |")
    te, tg = eager["total_hours"], graph["total_hours"]
    out.append("| **total** | " + " | ".join("**" + _h(x) + "**" for x in (te["mean"], te["cap"], tg["mean"], tg["cap"])) + " |")
    out += ["", headline(d)]
    return "\n".join(out)


def headline(d: dict) -> str:
    """The page's one-paragraph answer: one backbone's hours on the captured path, and what an H100 would take."""
    te, tg = d["estimate"]["total_hours"], d["estimate_graph"]["total_hours"]
    (name,) = d["backbones"]
    return say("gpu_graph", "headline", name=name, gpu=d["environment"]["gpu"].replace("NVIDIA ", ""),
               graph_mean=_h(tg["mean"]), graph_cap=_h(tg["cap"]), eager_mean=_h(te["mean"]), eager_cap=_h(te["cap"]))


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
