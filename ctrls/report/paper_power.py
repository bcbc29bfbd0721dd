"""What the paper's own tables can resolve (Tables 1 and 2): intervals and minimal detectable differences.

The paper reports percentages without intervals, on 40 (Table 1) and 500 (Table 2) test questions (the
sizes inferred in the design notes, book/design.md, "Table sizes"). For each CTRLS-vs-Base difference
(pass@20 and Succ.) this module gives Newcombe's *unpaired* hybrid score interval at the paper's n (the
paper publishes no per-question outcomes; our tables use the paired form) and the minimal detectable
difference (MDD) up and down from Base, at alpha = 0.05 and power 0.8 on the arcsine scale (Cohen's h).
Succ. is treated like pass@20, as a proportion over the table's questions. The formulas:
book/method.md, "ctrls/report/paper_power.py".
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ctrls.config.settings import BASE, setting_label
from ctrls.report.paper import PAPER_N, PAPER_TABLE1, PAPER_TABLE2
from ctrls.stats.power import (
    ALPHA,
    POWER,
    minimal_detectable_difference,
    newcombe_interval,
    paired_p_range,
)


def _count(pct: float, n: int, where: str) -> int:
    """The number of questions behind a published percentage; an error if it is off the n-grid."""
    x = pct * n / 100
    if abs(x - round(x)) > 1e-6:
        raise ValueError(f"{where}: {pct}% is not a multiple of 100/{n} (not a rate over {n} questions)")
    return int(round(x))


def paper_comparisons() -> pd.DataFrame:
    """Every CTRLS-vs-Base pair the paper reports: Table 1 (each eps row vs Base at the same
    backbone, dataset and eta) and Table 2 (each RL row vs Base), pass@20 and Succ., in %."""
    rows = []
    for (bb, ds), by_eta in PAPER_TABLE1.items():
        for eta, by_row in by_eta.items():
            for label, vals in by_row.items():
                if label != BASE:
                    rows.append(("Table 1", bb, ds, eta, label, vals, by_row[BASE]))
    for bb, by_ds in PAPER_TABLE2.items():
        for ds, by_row in by_ds.items():
            for label, vals in by_row.items():
                if label != BASE:
                    rows.append(("Table 2", bb, ds, math.nan, setting_label(*label), vals, by_row[BASE]))
    out = []
    for table, bb, ds, eta, label, vals, base in rows:
        for i, metric in enumerate(("pass@20", "Succ.")):
            out.append({"table": table, "backbone": bb, "dataset": ds, "temperature": eta, "config": label,
                        "metric": metric, "base (%)": base[i], "ctrls (%)": vals[i]})
    return pd.DataFrame(out)


def paper_power(alpha: float = ALPHA, power: float = POWER, n: dict[str, int] | None = None) -> pd.DataFrame:
    """One row per CTRLS-vs-Base difference of the paper's Tables 1 and 2: n, both rates, the
    difference and its 95% Newcombe interval (percentage points), whether the interval excludes 0,
    and the minimal detectable difference up and down from Base at that n (book/method.md)."""
    n = n or PAPER_N
    df = paper_comparisons()
    recs = []
    for r in df.to_dict("records"):
        nq = n[r["table"]]
        where = f"{r['table']} {r['backbone']} {r['dataset']} eta={r['temperature']} {r['config']} {r['metric']}"
        x1, x0 = _count(r["ctrls (%)"], nq, where), _count(r["base (%)"], nq, where + " (Base)")
        d, lo, hi = newcombe_interval(x1, nq, x0, nq, alpha)
        up, down = minimal_detectable_difference(x0 / nq, nq, alpha, power)
        mdd = up if d >= 0 else down
        recs.append({"n": nq, "diff (pp)": 100 * d, "lo (pp)": 100 * lo, "hi (pp)": 100 * hi,
                     "excludes 0": bool(lo > 0 or hi < 0), "MDD up (pp)": 100 * up, "MDD down (pp)": 100 * down,
                     "below MDD": bool(np.isnan(mdd) or abs(d) < mdd)})
    return pd.concat([df, pd.DataFrame(recs)], axis=1)


def paired_p_columns(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`paper_power`'s table with the exact McNemar p under the most and the least favourable
    pairing of questions (:func:`paired_p_range`) and the questions behind the difference."""
    lo, hi, k = [], [], []
    for r in t.to_dict("records"):
        x1, x0 = round(r["ctrls (%)"] * r["n"] / 100), round(r["base (%)"] * r["n"] / 100)
        a, b = paired_p_range(x1, x0, r["n"])
        lo.append(a), hi.append(b), k.append(abs(x1 - x0))
    return t.assign(**{"questions apart": k, "p, minimal discordance": lo, "p, maximal discordance": hi})


def table_statements(t: pd.DataFrame, alpha: float = ALPHA) -> dict[str, str]:
    """One statement per paper table from :func:`paired_p_columns`: whether any pairing of the
    questions could resolve a difference (exact McNemar p < alpha), and the range the published
    rates leave open."""
    out = {}
    for table, g in t.groupby("table", sort=False):
        n, k = int(g.n.iloc[0]), len(g)
        best, worst = int((g["p, minimal discordance"] < alpha).sum()), int((g["p, maximal discordance"] < alpha).sum())
        if best == 0:
            out[table] = (f"{table} (n = {n}): no difference is resolvable under any pairing of the questions: the "
                          f"largest is {int(g['questions apart'].max())} questions, and even with every discordant "
                          f"question one way the exact McNemar p is ≥ {g['p, minimal discordance'].min():.4g}.")
        else:
            out[table] = (f"{table} (n = {n}): the published rates cannot decide it: between {worst} (every "
                          f"question the rows could disagree on discordant) and {best} (minimal discordance) of the "
                          f"{k} differences would reach exact McNemar p < {alpha:g}; only the per-question outcomes "
                          f"could say which.")
    return out


def power_summary(t: pd.DataFrame) -> pd.DataFrame:
    """Per table and metric: comparisons, intervals that exclude 0, differences below the MDD, the
    largest |difference|, the median MDD up from Base (percentage points) over the comparisons that
    have one, and beside it how many have none ("no detectable gain": MDD up is NaN, a Base rate so
    close to 100% that no rate up to 100% is detectable at that n). The median alone would skip those
    cells and look optimistic."""
    g = t.groupby(["table", "metric"], sort=False)
    return pd.DataFrame({"n": g["n"].first(), "comparisons": g.size(), "intervals excluding 0": g["excludes 0"].sum(),
                         "|diff| below MDD": g["below MDD"].sum(),
                         "largest |diff| (pp)": g["diff (pp)"].agg(lambda v: v.abs().max()),
                         "median MDD up (pp)": g["MDD up (pp)"].median(),  # over the comparisons with an MDD up
                         "no detectable gain": g["MDD up (pp)"].agg(lambda v: int(v.isna().sum()))}).reset_index()


def power_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`paired_p_columns`'s rows for the page, narrow enough for its width: the difference and
    its interval in one column, short headers, explained in the frame's note. The numbers are the
    frame's, rounded to one decimal (p to three); nothing is recomputed."""
    def iv(r) -> str:
        return f"{r['diff (pp)']:+.1f} [{r['lo (pp)']:+.1f}, {r['hi (pp)']:+.1f}]"

    v = pd.DataFrame({
        "table": t["table"], "backbone": t["backbone"], "dataset": t["dataset"], "T": t["temperature"],
        "config": t["config"], "metric": t["metric"], "Base (%)": t["base (%)"].round(1),
        "CTRLS (%)": t["ctrls (%)"].round(1), "n": t["n"], "diff [95% CI] (pp)": t.apply(iv, axis=1),
        "excludes 0": t["excludes 0"], "MDD up": t["MDD up (pp)"].round(1), "MDD down": t["MDD down (pp)"].round(1),
        "below MDD": t["below MDD"], "apart": t["questions apart"],
        "p best": t["p, minimal discordance"].round(3), "p worst": t["p, maximal discordance"].round(3)})
    v.attrs["note"] = ("T: sampling temperature. diff [95% CI]: CTRLS − Base, Newcombe's hybrid score interval at "
                       "the paper's n (unpaired). MDD up/down: minimal detectable difference from Base, "
                       "percentage points (empty: not detectable even at 100%). apart: questions between the two "
                       "rates. p best / p worst: exact McNemar p under the most / least favourable pairing "
                       "of the questions.")
    return v.reset_index(drop=True)
