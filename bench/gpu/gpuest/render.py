"""The book section (``book/_includes/gpu_estimate_h100.md``) for an analytic JSON: ``analytic_markdown``
reads the numbers from the JSON; the prose and the tables' layout are in ``page.md.j2`` (jinja2)."""
from __future__ import annotations

import re
from pathlib import Path

# the decode runs of a backbone, in the tables' order, with their labels
SAMPLERS = (("base_b160", "ours, Base"), ("ctrls_b160", "ours, CTRLS"), ("hf_b160", "HF generate"),
            ("base_rl", "ours, Base"), ("ctrls_rl", "ours, CTRLS"), ("hf_rl", "HF generate"),
            ("base_lockstep", "ours, Base, lockstep RL"), ("ctrls_lockstep", "ours, CTRLS, lockstep RL"))


def hours(x: float, nd: int = 1) -> str:
    return f"{x:,.{nd}f}"


def ms(seconds: float, nd: int = 2) -> str:
    return f"{1e3 * seconds:.{nd}f}"


def pct(fraction: float) -> str:
    return f"{100 * fraction:.0f}%"


def page_context(data: dict, json_path: str) -> dict:
    """What ``page.md.j2`` shows, read from an analytic JSON (``analytic.analytic_data``)."""
    est = data["estimate"]
    multi = [k for k in data if re.fullmatch(r"estimate_\d+gpu", k)]
    est_n = data[multi[0]] if multi else None
    names = list(data["backbones"])
    bbs = data["backbones"]
    its0 = bbs[names[0]]["iterations"]
    lockstep = "ctrls_lockstep" in its0
    samplers = [{"name": n, "label": label, "it": bbs[n]["iterations"][key], "shape": bbs[n]["inputs"]["shape"]}
                for n in names for key, label in SAMPLERS if key in bbs[n]["iterations"]]
    work = [r for r in est["rows"] if r["backbone"] == names[0] and r["bound"] == "mean"]
    datasets = list(dict.fromkeys(r["dataset"] for r in work))
    seq = est.get("rl_training_sequential_hours") or {}
    return {
        "json_path": json_path, "env": data["environment"], "c": data["constants"], "est": est, "est_n": est_n,
        "W": est_n["world_size"] if est_n else 1, "names": names, "assumed": est["assumptions"],
        "cap": est["assumptions"]["cap_tokens"], "b160_rows": its0["ctrls_b160"]["rows"],
        "rl_rows": its0["ctrls_rl"]["rows"], "cw": bbs[names[0]]["inputs"]["counts_real_width"],
        "prompt_tokens": bbs[names[0]]["inputs"]["prompt_tokens"], "samplers": samplers,
        "lockstep": its0["ctrls_lockstep"] if lockstep else None,
        "sequential": {b: seq.get(b, float("nan")) for b in ("mean", "cap")},
        "bounds": sorted({it[e]["bound"] for b in bbs.values() for k, it in b["iterations"].items()
                          if not k.startswith("hf") for e in ("first", "last")}),
        "busy_rl": [bbs[n]["iterations"]["ctrls_rl"]["gpu_busy_fraction"]["first"] for n in names],
        "busy_lockstep": ([bbs[n]["iterations"]["ctrls_lockstep"]["gpu_busy_fraction"]["first"] for n in names]
                          if lockstep else []),
        "largest": sorted(est["stages_hours"].items(), key=lambda kv: -kv[1]["cap"])[:2],
        "redraw_ops_per_call": its0["ctrls_b160"]["ops"]["redraw_ops_per_call"],
        "row_drop_copy_s": [bbs[n]["iterations"]["ctrls_b160"]["row_drop_copy_s"] for n in names],
        "datasets": datasets,
        "work": [(s, [next(r["detail"] for r in work if r["stage"] == s and r["dataset"] == d) for d in datasets])
                 for s in est["stages_hours"]],
        "fits": bbs[names[0]]["cpu_fits_full"], "sensitivity": data.get("sensitivity"),
        **static_context(data, names),
    }


def static_context(data: dict, names: list[str]) -> dict:
    """The static (CUDA-graph) path's part of the page: per-iteration rows, its estimates and the floor's."""
    bbs = data["backbones"]
    W = next((int(k[len("estimate_static_"):-3]) for k in data if re.fullmatch(r"estimate_static_\d+gpu", k)), 1)
    rows = [{"name": n, "label": label, "it": bbs[n]["static"]["iterations"][key],
             "eager": bbs[n]["iterations"][key], "shape": bbs[n]["inputs"]["shape"]}
            for n in names for key, label in SAMPLERS if key in bbs[n]["static"]["iterations"]]
    st0 = bbs[names[0]]["inputs"]["static"]
    return {"static": rows, "est_static": data["estimate_static"], "est_floor": data["estimate_bw_floor"],
            "est_static_n": data.get(f"estimate_static_{W}gpu"), "est_floor_n": data.get(f"estimate_bw_floor_{W}gpu"),
            "summary": data["static_summary"], "static_cw": st0["counts_real_width"], "static_host": st0["host"],
            "static_bounds": sorted({r["it"]["it"]["bound"] for r in rows}),
            "node_bound_hi": sorted({r["it"]["rows"] for r in rows
                                     if r["it"]["ops"]["graph_nodes"] * data["constants"]["node_us_range"][1]
                                     * 1e-6 > max(r["it"]["it"]["t_mem"], r["it"]["it"]["t_flop"])}),
            "kv_heavy": [r["name"] for r in rows if r["label"] == "ours, Base" and r["it"]["rows"] == rows[0]["it"]["rows"]
                         and r["it"]["it"]["kv_read_bytes"] > r["shape"]["weight_bytes"]],
            "static_busy": {r["label"]: [x["it"]["gpu_busy_fraction"] for x in rows if x["label"] == r["label"]]
                            for r in rows},
            "redraw_share": [r["it"]["host"]["redraws"] / r["it"]["it"]["seconds"] for r in rows
                             if r["label"] == "ours, CTRLS" and r["it"]["rows"] == rows[0]["it"]["rows"]]}


def analytic_markdown(data: dict, json_path: str) -> str:
    """The book section for an analytic JSON (every number on it is read from ``data``)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters.update(fmt=format, f=hours, ms=ms, pct=pct)
    return env.get_template("page.md.j2").render(page_context(data, json_path))
