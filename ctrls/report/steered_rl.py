"""RL when the state steers: Table 2's policies trained under the state prompt, read for the RL page.

``studies/seeds.py`` on runs made with ``state_prompt.use=true`` whose RL stage ran too (stored in
``studies/results/state_prompt_rl.json``): per data seed, each Table 2 policy's pass@1 against Base and
against the pretrained policy's epsilon row on the same test questions (paired by question, Holm over the
policies), beside the seed's kappa and fixed-s0 harm (``ctrls.report.mechanism.stage_option_frame``) and
each stage's wall seconds. The pretrained epsilon row is what RL starts from: RL adds something only
where a policy beats it.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ctrls.report.mechanism import (
    checked_count,
    checked_interval,
    checked_number,
    checked_seeds,
    ci_text,
    read_seeds_result,
    reading,
    results_dir,
    stored_profile,
    stored_setting,
)
from ctrls.report.stored import position_floor
from ctrls.report.words import say
from ctrls.stats.metrics import format_p

RL_RESULT = "studies/results/state_prompt_rl.json"
VS = {"− Base": "minus_base", "− pretrained ε": "minus_pretrained_eps"}


def rl_frame(path: str | Path | None = None) -> pd.DataFrame:
    """One row per (data seed, Table 2 policy): pass@1 with its samples and questions, and per comparison
    (``VS``) the paired difference [95%] and its Holm p; refused, naming the file and the field, when the runs were
    not made with the state prompt and its position mask (the page says both), a seed has no RL rows or a field is wrong."""
    path = Path(path) if path else results_dir() / RL_RESULT
    d = read_seeds_result(path, settings={"state_prompt.use": "true", "grid.position_floor": position_floor},
                          seed_fields=("rl_table2",))
    try:
        floor = float(stored_setting(d, "grid.position_floor") or 0)
    except ValueError:
        floor = 0.0
    if not 0 < floor <= 1:
        raise ValueError(f"{path}: not runs with the position mask "
                         f"(grid.position_floor {stored_setting(d, 'grid.position_floor')})")
    with reading(path):
        t = _rows(d, path)
    t.attrs.update(commit=d.get("commit", "?"), source=str(path), machine=d.get("machine", {}), profile=stored_profile(d, path),
                   floor=floor, seconds={int(s["data_seed"]): s.get("stage_seconds", {}) for s in d["seeds"]})
    return t


def _rows(d: dict, path) -> pd.DataFrame:
    """The rows of :func:`rl_frame`, validated."""
    rows = []
    for s in checked_seeds(d.get("seeds") or [], path):
        rl = s.get("rl_table2")
        if not isinstance(rl, dict) or not rl:
            raise ValueError(f"{path}: data seed {s.get('data_seed')!r} has no RL rows (rl_table2): run the rl stage")
        for name, r in rl.items():
            row = {"data seed": int(s["data_seed"]), "policy": str(name), "pass@1": checked_number(r, "pass1", path, 0, 1),
                   "samples": checked_count(r, "samples", path),
                   "questions": checked_count(r["minus_base"], "questions", path)}  # one paired set for both
            for label, key in VS.items():
                diff, lo, hi = checked_interval(r[key], "diff", "lo", "hi", path)
                row.update({label: diff, f"{label} lo": lo, f"{label} hi": hi,
                            f"{label} p (Holm)": checked_number(r[key], "p_holm", path, 0, 1),
                            f"{label} b": checked_number(r[key], "b", path, 0, 1)})
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no seeds")
    return pd.DataFrame(rows)


def steered_rl_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`rl_frame` for the page: pass@1 with n, each difference in points [95%] with its Holm p."""
    out = pd.DataFrame({"data seed": t["data seed"], "policy": t.policy,
                        "pass@1 (%)": [f"{100 * v:.1f} (n = {n})" for v, n in zip(t["pass@1"], t.samples)],
                        "questions": t.questions})
    for label in VS:
        out[f"{label} (points)"] = [f"{ci_text(100 * v, 100 * lo, 100 * hi, '{:+.1f}')}, Holm p {format_p(p)}" for v, lo, hi, p in
                                    zip(t[label], t[f"{label} lo"], t[f"{label} hi"], t[f"{label} p (Holm)"])]
    return out


def rl_sentence(t: pd.DataFrame) -> str:
    """:func:`rl_frame` in sentences a reader can check against the table: per seed, Base's and the pretrained
    epsilon row's pass@1 and how many policies beat each (95% interval above 0). The stages' seconds stay in
    the frame's attrs (the design notes cite them with the load they ran under)."""
    out = []
    for seed, g in t.groupby("data seed", sort=True):
        n = len(g)
        beat = {label: int((g[f"{label} lo"] > 0).sum()) for label in VS}
        lost = {label: int((g[f"{label} hi"] < 0).sum()) for label in VS}
        out.append(say("pages", "steered rl", seed=seed, questions=int(g.questions.iloc[0]), n=n,
                       base=format(100 * g["− Base b"].iloc[0], ".1f") + "%",
                       eps=format(100 * g["− pretrained ε b"].iloc[0], ".1f") + "%",
                       beat_base=beat["− Base"], lost_base=lost["− Base"], beat_eps=beat["− pretrained ε"],
                       lost_eps=lost["− pretrained ε"]))
        if beat["− Base"] and not beat["− pretrained ε"]:
            out.append(say("pages", "steered rl.state"))
    return " ".join(out)


__all__ = ["RL_RESULT", "rl_frame", "rl_sentence", "steered_rl_view"]
