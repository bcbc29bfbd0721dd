"""The paper's tables and their layouts, built from our runs' artifacts: Table 1 (exploration) with
its ablation, controllability and diversity companions (computed from the samples in
``ctrls.stages.sample_tables``, re-exported here), Table 2 (RL), Table 3's rubric table, and the
reward-rate table of the RL page, each a DataFrame with n and 95% intervals; the ``*_view`` / ``layout``
functions lay a table out for a page (one notebook line per table). The paper's numbers come from
``ctrls.report.paper``.

Rates (pass@n, Succ., match rates) carry Wilson score intervals and paired differences Newcombe's
paired interval (``ctrls.stats.metrics``, sound at 0% and 100%); p-values are exact McNemar or
within-question permutation p-values, printed by ``metrics.format_p`` (never as 0). Where a page
draws verdicts from a table's family of comparisons (Table 1's rows against Base, the ablation, the
controllability rows), the table adds Holm-adjusted p-values (``metrics.holm``) over that family,
and its difference intervals are *family* intervals on the same footing: Newcombe's paired
interval at level 1 - 0.05/m over the family's m comparisons (Bonferroni, simultaneous 95%). A
verdict says *higher* / *lower* only when the adjusted p and the family interval both resolve the
difference, and otherwise states the estimate's direction (``ctrls.report.verdicts.direction``). Each
comparison belongs to one family per page: fixed s0 − Base is the ablation's, not Table 1's.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ctrls.config.schema import Config
from ctrls.config.settings import BASE, FIXED, parse_setting
from ctrls.generate.judge import CRITERIA, LABELS
from ctrls.report.provenance import ci_decimals, with_pct_ci
from ctrls.report.words import say
from ctrls.stages.exploration import load_samples
from ctrls.stages.rl import load_table2_samples
from ctrls.stages.sample_tables import (  # noqa: F401 (the book's tables, computed from the samples)
    ALPHA,
    ablation_table,
    controllability_table,
    diversity_table,
    matrices,
    matrix_frame,
    pass_at_k_curves,
    table1,
)
from ctrls.stats.metrics import (
    bootstrap_ci,
    format_p,
)
from ctrls.stats.power import wilson_interval


def layout(t: pd.DataFrame) -> pd.DataFrame:
    """Our Table 1 in the paper's layout: rows (eta, config), columns (backbone · dataset, metric)."""
    t = with_pct_ci(t).assign(model=t.backbone.str.split("/").str[-1] + " · " + t.dataset)
    wide = t.pivot_table(index=["temperature", "config"], columns="model", values=["pass@n (%)", "Succ. (%)"],
                         aggfunc="first", sort=False)
    wide = wide.swaplevel(0, 1, axis=1).sort_index(axis=1, level=0, sort_remaining=False)
    wide.index = wide.index.set_names(["η", "exploration"])
    return wide.fillna("—")  # a row a dataset has no samples for: the transfer datasets run CTRLS and Base only (the page says)


def _isnan(x) -> bool:
    return x is None or (isinstance(x, (float, np.floating)) and math.isnan(x))


def _fmt(v: float, lo: float, hi: float, scale: float = 100.0, digits: int | None = None, sign: bool = False,
         n: int | None = None) -> str:
    """``v [lo, hi]`` scaled; ``digits`` defaults to what the interval supports (``report.ci_decimals``).
    NaN bounds beside a value (``metrics.bootstrap_ci`` of one value) print the value alone: "9.00 (n = 1,
    no interval)" (``n`` when known), never "[nan, nan]"."""
    if _isnan(v):
        return "–"
    if _isnan(lo) or _isnan(hi):
        f = f"{{:{'+' if sign else ''}.{2 if digits is None else digits}f}}"
        return f"{f.format(scale * v)} ({'' if n is None else f'n = {n}, '}no interval)"
    if digits is None:
        digits = ci_decimals(scale * lo, scale * hi)
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f"{f.format(scale * v)} [{f.format(scale * lo)}, {f.format(scale * hi)}]"


def _fmt_column(v, lo, hi, scale: float = 100.0, sign: bool = False, n=None) -> list[str]:
    """:func:`_fmt` over a column, every row rounded alike: to the most decimals any row's interval
    supports (``report.column_decimals``); a column never mixes "+0 [-68, +68]" with "+16.7 [...]"."""
    from ctrls.report.provenance import column_decimals

    v, lo, hi = list(v), list(lo), list(hi)
    d = column_decimals(lo, hi, scale)
    n = [None] * len(v) if n is None else list(n)
    return [_fmt(a, b, c, scale=scale, digits=d, sign=sign, n=k) for a, b, c, k in zip(v, lo, hi, n)]


def _verdict(p_holm: float, d: float = math.nan, lo: float | None = None, hi: float | None = None) -> str:
    """The page's verdict from a Holm-adjusted p-value at level ``ALPHA`` and the family interval
    beside it (``verdicts.direction``): *higher* / *lower* when both resolve the difference, else
    *no detectable difference* with the estimate's direction."""
    from ctrls.report.verdicts import direction

    if _isnan(p_holm):
        return "–"
    return direction(d, p_holm, lo=lo, hi=hi)


VERDICT = f"verdict (Holm, α = {ALPHA:g}, with the family interval)"


def vs_base_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`table1`'s comparisons with Base for the book: Δ pass@n in points with Newcombe's paired
    interval at the family level (simultaneous 95%, Bonferroni over the table's comparisons), McNemar's exact p, the
    Holm-adjusted p and the verdict drawn from it."""
    t = t[t["p"].notna()].reset_index(drop=True)  # no stray index (the rows left: 1, 3, 4, ...)
    return pd.DataFrame({
        "backbone": t.backbone.str.split("/").str[-1], "dataset": t.dataset, "η": t.temperature,
        "config": t.config, "questions": t.questions,
        "Δ pass@n vs Base (pts)": _fmt_column(t["Δ pass@n vs Base"], t["Δ lo"], t["Δ hi"], sign=True),
        "p": t["p"].map(format_p), "p (Holm)": t["p (Holm)"].map(format_p),
        VERDICT: list(map(_verdict, t["p (Holm)"], t["Δ pass@n vs Base"], t["Δ lo"], t["Δ hi"]))})


def ablation_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`ablation_table` for the book: differences in percentage points with their 95% intervals,
    p-values and Holm-adjusted p-values (``metrics.format_p``: never printed as 0), and the verdicts
    drawn from the Holm-adjusted p-values."""
    if t.empty:
        return pd.DataFrame({"note": ["no fixed-s0 row in these samples (grid.fixed_state is false)"]})
    return pd.DataFrame({
        "backbone": t.backbone.str.split("/").str[-1], "dataset": t.dataset, "η": t.temperature,
        "comparison": t.comparison, "questions": t.questions,
        "Δ pass@n (pts)": _fmt_column(t["Δ pass@n"], t["Δ pass@n lo"], t["Δ pass@n hi"], sign=True),
        "p (pass@n)": t["p (pass@n)"].map(format_p), "p (pass@n, Holm)": t["p (pass@n, Holm)"].map(format_p),
        "pass@n": list(map(_verdict, t["p (pass@n, Holm)"], t["Δ pass@n"], t["Δ pass@n lo"], t["Δ pass@n hi"])),
        "Δ Succ. (pts)": _fmt_column(t["Δ Succ."], t["Δ Succ. lo"], t["Δ Succ. hi"], sign=True),
        "p (Succ.)": t["p (Succ.)"].map(format_p), "p (Succ., Holm)": t["p (Succ., Holm)"].map(format_p),
        "Succ.": list(map(_verdict, t["p (Succ., Holm)"], t["Δ Succ."], t["Δ Succ. lo"], t["Δ Succ. hi"]))})


def controllability_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`controllability_table` for the book: rates in % with their 95% intervals."""
    cols = {"backbone": t.backbone.str.split("/").str[-1], "dataset": t.dataset, "η": t.temperature,
            "config": t.config, "K": t.K, "questions": t.questions, "steps": t.steps,
            "follows its state (%)": _fmt_column(t["follows"], t["follows lo"], t["follows hi"]),
            "chance 1/K (%)": (100 * t.chance).round(1)}
    if "Base, random states" in t:
        cols["Base steps"] = t["Base steps"]
        cols["Base, random states (%)"] = _fmt_column(t["Base, random states"], t["Base, random states lo"],
                                                      t["Base, random states hi"])
    if "Δ vs Base" in t:
        cols["Δ vs Base (pts)"] = _fmt_column(t["Δ vs Base"], t["Δ lo"], t["Δ hi"], sign=True)
        cols["p"] = t["p"].map(format_p)
        cols["p (Holm)"] = t["p (Holm)"].map(format_p)
        cols[VERDICT] = list(map(_verdict, t["p (Holm)"], t["Δ vs Base"], t["Δ lo"], t["Δ hi"]))
    if "κ" in t:  # the epsilon rows against the independent-chain null (ctrls.stats.agreement)
        cols["null steps"] = t["null steps"].map(lambda v: "—" if _isnan(v) else str(int(v)))
        cols["independent-chain null (%)"] = [("—" if _isnan(v) else f"{100 * v:.1f}") for v in t["null"]]
        cols["κ [95%]"] = _fmt_column(t["κ"], t["κ lo"], t["κ hi"], scale=1.0)
        cols["p (κ, Holm)"] = t["p (κ, Holm)"].map(lambda v: "—" if _isnan(v) else format_p(v))
        cols["κ verdict"] = [("—" if _isnan(p) else _verdict(p, k, lo, hi))
                             for p, k, lo, hi in zip(t["p (κ, Holm)"], t["κ"], t["κ lo"], t["κ hi"])]
    return pd.DataFrame(cols)


def diversity_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`diversity_table` for the book: means over questions with their 95% intervals; a value
    without one (one question) reads "x (n = 1, no interval)", and the fixed-s0 row's drawn-state
    entropy, fixed by construction, is printed as such."""
    cols = {"backbone": t.backbone.str.split("/").str[-1], "dataset": t.dataset, "η": t.temperature,
            "config": t.config, "questions": t.questions, "samples": t.samples}
    from ctrls.report.provenance import column_decimals

    for name in ("distinct answers", "encoded-state entropy (bits)", "drawn-state entropy (bits)"):
        if name in t:
            d = column_decimals(t[f"{name} lo"].astype(float), t[f"{name} hi"].astype(float), 1.0)
            cols[name] = [f"{v:.{2 if d is None else d}f} (fixed by construction: s_0 at every step)"
                          if name.startswith("drawn") and c == FIXED and not _isnan(v)
                          else _fmt(v, lo, hi, scale=1.0, digits=d, n=nq)
                          for v, lo, hi, c, nq in zip(t[name], t[f"{name} lo"], t[f"{name} hi"], t.config, t.questions)]
    return pd.DataFrame(cols)


def table2(cfg: Config) -> pd.DataFrame:
    """Table 2 in long form: Base and each RL policy of ``rl.table2`` (labelled by
    ``setting_label``), with pass@n and Succ. and their CIs (see ``table1``). Base is the
    RL stage's own Base samples when ``rl.n_test`` is set (the same questions), else the
    exploration stage's at eta = rl.temperature. Table 3's extra rows are left out."""
    # Table 2: pass@n and Succ. after RL, Base and each RL policy
    rl_samples = load_table2_samples(cfg)
    labels = [BASE] + list(dict.fromkeys(parse_setting(s, cfg).label for s in cfg.rl.table2))
    if cfg.rl.n_test is None:
        try:
            base = load_samples(cfg)
            base = base[(base.config == BASE) & (base.temperature == cfg.rl.temperature)]
        except FileNotFoundError:
            base = rl_samples.iloc[:0]
        rl_samples = pd.concat([base, rl_samples[rl_samples.config != BASE]], ignore_index=True)
    both = rl_samples[rl_samples.config.isin(labels)]
    order = {c: i for i, c in enumerate(labels)}
    t = table1(both, seed=cfg.seed)
    return t.sort_values(["backbone", "dataset"], kind="stable").sort_values(
        "config", key=lambda c: c.map(order), kind="stable").reset_index(drop=True)


def reward_rate(cfg: Config, curves: pd.DataFrame) -> pd.DataFrame:
    """The training reward rate of each pair, from the runs' logs: correct trajectories / sampled
    trajectories over every training step of every run (each step samples
    ``rl.questions_per_step x rl.group_size`` trajectories), with a 95% Wilson interval."""
    per_step = cfg.rl.questions_per_step * cfg.rl.group_size
    rows = []
    for pair, g in curves[curves.kind == "train"].groupby("pair", sort=False):
        n = len(g) * per_step
        k = int(round(float((g.reward * per_step).sum())))
        lo, hi = wilson(k, n)
        rows.append({"pair": pair, "runs": int(g.groupby(["setting", "seed"]).ngroups), "trajectories": n,
                     "correct": k, "reward rate": k / n if n else math.nan, "95% CI": (lo, hi)})
    return pd.DataFrame(rows)


RL_SUMMARY_COLUMNS = {"accuracy": "accuracy", "pass@k": "pass@k", "succ": "Succ.",
                      "policy_entropy": "policy entropy (nats)", "state_usage_entropy": "state-usage entropy (nats)"}


def rl_summary(curves: pd.DataFrame) -> pd.DataFrame:
    """Each RL setting's held-out evaluation at its last step beside step 0 (mean over seeds), with
    readable headers and a caption (``attrs["note"]``, shown above the table)."""
    from ctrls.report.plots import pair_title

    ev = curves[curves.kind == "eval"]
    last = ev.sort_values("step").groupby(["pair", "setting", "seed"]).tail(1)
    first = ev[ev.step == 0]
    cols = list(RL_SUMMARY_COLUMNS)
    t = (last.groupby(["pair", "setting"])[cols].mean()
         .join(first.groupby(["pair", "setting"])[["accuracy", "policy_entropy"]].mean()
               .rename(columns=lambda c: f"{RL_SUMMARY_COLUMNS[c]} at step 0"))
         .rename(columns=RL_SUMMARY_COLUMNS).reset_index())
    t["pair"] = t["pair"].map(pair_title)
    t = t.rename(columns={"pair": "backbone, dataset"})
    steps = last.step.max() if len(last) else 0
    seeds = ev.seed.nunique() if "seed" in ev else 1
    t.attrs["note"] = (f"Each RL setting's held-out evaluation after RL (step {steps}) beside step 0, mean over "
                       f"{seeds} seed{'s' if seeds != 1 else ''}: accuracy, pass@k and Succ. as fractions, "
                       "entropies in nats.")
    return t


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion k/n (``ctrls.stats.power.wilson_interval``; sound at
    k = 0, unlike the Wald one); (NaN, NaN) for n = 0."""
    if n == 0:
        return math.nan, math.nan
    return wilson_interval(k, n)


SYNTHETIC_PAGE = "07_synthetic.html"  # the built page beside the RL page: Sphinx leaves links in outputs as they are


def synthetic_link() -> str:
    """A Markdown link to the synthetic study's page, by its own title (its notebook's first heading)."""
    import json

    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "07_synthetic.ipynb").read_text())
    title = next(line[2:].strip() for c in nb["cells"] if c["cell_type"] == "markdown"
                 for line in "".join(c["source"]).splitlines() if line.startswith("# "))
    return f"[{title}]({SYNTHETIC_PAGE})"


def reward_note(cfg: Config, rates: pd.DataFrame, low: float = 0.05) -> str:
    """What the measured reward rate (``reward_rate``) means for the curves, in words built from the numbers."""
    parts = []
    for _, r in rates.iterrows():
        lo, hi = r["95% CI"]
        parts.append(say("pages", "reward.pair", pair=r.pair, correct=r.correct, trajectories=r.trajectories,
                         rate=format(r["reward rate"], ".1%"), lo=format(lo, ".1%"), hi=format(hi, ".1%"), runs=r.runs,
                         steps=cfg.rl.steps))
    text = say("pages", "reward", pairs="; ".join(parts))
    if len(rates) and (rates["reward rate"] < low).all():
        return text + say("pages", "reward.low", low=format(low, ".0%"), link=synthetic_link())
    return text + say("pages", "reward.informative", link=synthetic_link())


def rubric_table(judged: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Table 3 from judged rows: per config, n, the mean score per criterion as "mean [lo, hi]"
    with a 95% percentile-bootstrap interval over the judged rows ("mean (n = 1, no interval)" for a
    config with one judged row), and how many of the config's
    n x 5 scores were read by regex, clipped, or defaulted."""
    # Table 3: the rubric scores per setting
    out = []
    for cfg, g in judged.groupby("config", sort=False):
        row = {"config": cfg, "n": len(g)}
        for k in CRITERIA:
            m, lo, hi = bootstrap_ci(g[k].to_numpy(), n_boot=n_boot, seed=seed)
            row[LABELS[k]] = _fmt(m, lo, hi, scale=1.0, digits=2, n=len(g))
        how = g[[f"parse_{k}" for k in CRITERIA]].to_numpy().ravel()
        row.update({"scores read by regex": int((how == "regex").sum()), "clipped": int((how == "clipped").sum()),
                    "defaulted": int((how == "default").sum())})
        out.append(row)
    return pd.DataFrame(out)
