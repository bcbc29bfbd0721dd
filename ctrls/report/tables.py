"""The paper's tables and their layouts, built from our runs' artifacts: Table 1 (exploration) with
its ablation, controllability and diversity companions, Table 2 (RL), Table 3's rubric table, and
the reward-rate table of the RL page. Each takes the samples a stage wrote (or the config, to read
them) and returns a DataFrame with n and 95% intervals; the ``*_view`` / ``layout`` functions lay a
table out for a page (one notebook line per table). The paper's numbers come from ``ctrls.report.paper``.

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
from ctrls.data.answers import normalize
from ctrls.generate import controllability as ctl
from ctrls.generate.judge import CRITERIA, LABELS
from ctrls.report.mechanism import base_chain, null_steps
from ctrls.report.provenance import ci_decimals, with_pct_ci
from ctrls.stages.exploration import load_samples
from ctrls.stages.rl import load_table2_samples
from ctrls.stats.agreement import kappa_vs_null
from ctrls.stats.metrics import (
    bootstrap_ci,
    format_p,
    holm,
    paired_rate_difference,
    pass_at_k,
    rate_interval,
)
from ctrls.stats.power import wilson_interval


def _where(df: pd.DataFrame) -> str:
    """"config 'eps=0.1' (backbone ..., dataset ..., eta 0.7)" for error messages."""
    def one(col: str) -> str:
        vals = df[col].unique().tolist() if col in df else []
        return repr(vals[0]) if len(vals) == 1 else repr(vals)
    return f"config {one('config')} (backbone {one('backbone')}, dataset {one('dataset')}, eta {one('temperature')})"


def matrix_frame(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """(questions x samples) frame of ``column`` for the samples of one config, questions sorted by id.

    Every question must hold every sample index of the config exactly once: a missing sample would
    otherwise enter the matrix as NaN, which ``bool`` turns into True (a correct answer). A question
    that is short, a (question, sample) that occurs twice, or a missing value is a ValueError naming
    the config and the question."""
    if df.empty:
        raise ValueError(f"no samples for {column!r}")
    key = ["question_id", "sample_index"]
    dup = df.duplicated(key)
    if dup.any():
        r = df[dup].iloc[0]
        raise ValueError(f"{_where(df)}: question {r.question_id!r} has sample {int(r.sample_index)} more than once")
    piv = df.pivot(index="question_id", columns="sample_index", values=column).sort_index()
    short = piv.isna().any(axis=1)
    if short.any():
        qid = short[short].index[0]
        missing = [int(c) for c in piv.columns[piv.loc[qid].isna()]]
        raise ValueError(f"{_where(df)}: question {qid!r} is short: {len(missing)} of {piv.shape[1]} samples "
                         f"missing or without a {column!r} value (sample index {missing[:10]}); "
                         f"rerun the stage that wrote them")
    return piv


def matrices(df: pd.DataFrame, column: str) -> np.ndarray:
    """(questions x samples) matrix of a boolean column, questions sorted by id (see :func:`matrix_frame`)."""
    return matrix_frame(df, column).to_numpy(dtype=bool)


def _paired(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Two matrix frames cover the same questions and sample indices (a paired comparison is possible)."""
    return a.index.equals(b.index) and a.columns.equals(b.columns)


ALPHA = 0.05  # the level of every interval (95%) and of the Holm verdicts


def _per_question(m: np.ndarray, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(successes, trials) per question of a (questions x samples) boolean matrix: pass@n (``correct``:
    any correct sample, one trial per question) or Succ. (``valid``: valid samples of all samples)."""
    if column == "correct":
        return m.any(axis=1).astype(float), np.ones(len(m))
    return m.sum(axis=1).astype(float), np.full(len(m), float(m.shape[1]))


def table1(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Table 1 in long form: one row per (backbone, dataset, eta, config) with pass@n and Succ.
    (fractions, with 95% Wilson intervals, ``metrics.rate_interval``) and a paired comparison to
    Base on the same questions (left empty where Base has other questions or sample counts, and
    for the "fixed s0" row, whose comparison with Base belongs to the ablation's family): Newcombe's
    paired interval for the pass@n difference at the family level 1 - 0.05/m (Bonferroni over the
    m rows compared with Base, "family"), McNemar's exact p, and that p Holm-adjusted over the same
    m rows ("p (Holm)"). ``n_boot`` and ``seed``:
    permutations for clustered p-values (unused by pass@n's exact test)."""
    lack = [c for c in ("backbone", "dataset", "temperature", "config", "question_id", "sample_index") if c not in df]
    if df.empty or lack:  # a clear error, not an AttributeError on a missing column
        raise ValueError("Table 1: no samples (an empty frame)" if df.empty
                         else f"Table 1: the samples lack the column(s) {lack}")
    # Table 1: pass@n and Succ. per (backbone, dataset, eta, row)
    out, pairs = [], []
    for (b, ds, eta), grp in df.groupby(["backbone", "dataset", "temperature"], sort=False):
        base_c = matrix_frame(grp[grp.config == BASE], "correct") if (grp.config == BASE).any() else None
        for cfg_label, g in grp.groupby("config", sort=False):
            cf = matrix_frame(g, "correct")
            c, v = cf.to_numpy(dtype=bool), matrices(g, "valid")
            pr, sr = rate_interval(*_per_question(c, "correct")), rate_interval(*_per_question(v, "valid"))
            p, plo, phi = pr["rate"], pr["lo"], pr["hi"]  # Table 1: pass@n, Wilson
            s, slo, shi = sr["rate"], sr["lo"], sr["hi"]  # Table 1: Succ., Wilson at n_eff
            row = {"backbone": b, "dataset": ds, "temperature": eta, "config": cfg_label,
                   "questions": c.shape[0], "samples": c.shape[1], "pass@n": p, "pass@n lo": plo, "pass@n hi": phi,
                   "succ": s, "succ lo": slo, "succ hi": shi}
            if base_c is not None and cfg_label not in (BASE, FIXED) and _paired(cf, base_c):
                pairs.append((len(out), c, base_c.to_numpy(dtype=bool)))
            out.append(row)
    for i, c, bc in pairs:  # the family: every row compared with Base; intervals at 1 - ALPHA / family
        cmp = paired_rate_difference(*_per_question(c, "correct"), *_per_question(bc, "correct"),
                                     alpha=ALPHA / len(pairs), n_perm=n_boot, seed=seed)
        out[i].update({"Δ pass@n vs Base": cmp["diff"], "Δ lo": cmp["lo"], "Δ hi": cmp["hi"], "p": cmp["p_value"],
                       "family": len(pairs)})
    t = pd.DataFrame(out)
    for col in ("Δ pass@n vs Base", "Δ lo", "Δ hi", "p", "family"):  # present (NaN) when no row could be paired
        if col not in t:
            t[col] = math.nan
    t["p (Holm)"] = holm(t["p"])  # the family: every row compared with Base
    t["_o"] = t.config.map(_row_order)
    return t.sort_values(["backbone", "dataset", "temperature", "_o"]).drop(columns="_o").reset_index(drop=True)


def ablation_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The no-transition ablation's paired comparisons, per (backbone, dataset, eta): "fixed s0" − Base
    (what the trained adapter does without transitions) and CTRLS(epsilon) − "fixed s0" for each
    epsilon (what the transitions add). Differences in pass@n and in Succ. (fractions), each with
    Newcombe's paired interval at the family level 1 - 0.05/m and a two-sided p-value
    (:func:`ctrls.stats.metrics.paired_rate_difference`: exact McNemar for pass@n, a within-question
    permutation test for Succ.), and that p Holm-adjusted over the whole table: the family of m
    ("family") is every comparison, both metrics, the one the page draws its verdicts from; fixed s0
    − Base belongs to this family only (Table 1's leaves it out)."""
    def comparisons(grp):
        labels = sorted(grp.config.unique(), key=_row_order)
        if FIXED not in labels:
            return []
        pairs = [(FIXED, BASE)] if BASE in labels else []
        return pairs + [(c, FIXED) for c in labels if c not in (BASE, FIXED)]

    groups = list(df.groupby(["backbone", "dataset", "temperature"], sort=False))
    family = 2 * sum(len(comparisons(grp)) for _, grp in groups)  # every comparison, both metrics
    out = []
    for (b, ds, eta), grp in groups:
        for a_label, b_label in comparisons(grp):
            ga, gb = grp[grp.config == a_label], grp[grp.config == b_label]
            row = {"backbone": b, "dataset": ds, "temperature": eta, "comparison": f"{a_label} − {b_label}"}
            for metric_name, column in (("pass@n", "correct"), ("Succ.", "valid")):
                fa, fb = matrix_frame(ga, column), matrix_frame(gb, column)
                if not _paired(fa, fb):
                    raise ValueError(f"{a_label!r} and {b_label!r} (backbone {b!r}, dataset {ds!r}, eta {eta}) "
                                     f"do not cover the same questions and samples: no paired comparison")
                cmp = paired_rate_difference(*_per_question(fa.to_numpy(dtype=bool), column),
                                             *_per_question(fb.to_numpy(dtype=bool), column), alpha=ALPHA / family,
                                             n_perm=n_boot, seed=seed)
                row.update({f"Δ {metric_name}": cmp["diff"], f"Δ {metric_name} lo": cmp["lo"],
                            f"Δ {metric_name} hi": cmp["hi"], f"p ({metric_name})": cmp["p_value"]})
            row["questions"] = fa.shape[0]
            row["family"] = family
            out.append(row)
    t = pd.DataFrame(out)
    if not t.empty:  # Holm over the family: every comparison of the table, both metrics
        adj = holm(np.r_[t["p (pass@n)"].to_numpy(float), t["p (Succ.)"].to_numpy(float)])
        t["p (pass@n, Holm)"], t["p (Succ., Holm)"] = adj[:len(t)], adj[len(t):]
    return t


def _flat_steps(g: pd.DataFrame, target: str) -> tuple[np.ndarray, np.ndarray, list]:
    """(target, encoded, question) per step of the samples in ``g``; ``target`` names the column of
    the states each step is compared with (a list per sample, as long as ``encoded``)."""
    t, e, q = [], [], []
    for r in g.itertuples(index=False):
        ts, es = list(getattr(r, target)), list(r.encoded)
        if len(ts) != len(es):
            raise ValueError(f"config {r.config!r}, question {r.question_id!r}, sample {r.sample_index}: "
                             f"{len(ts)} {target} for {len(es)} re-encoded steps")
        t += ts
        e += es
        q += [r.question_id] * len(es)
    return np.asarray(t, dtype=int), np.asarray(e, dtype=int), q


def _base_targets(base: pd.DataFrame, label: str, epsilon: float) -> pd.DataFrame:
    """Base samples with a ``target`` column: the random states a Base step is paired with for row
    ``label``: the prompt's s_0 at every step for "fixed s0", else the chain drawn with that epsilon."""
    if label == FIXED:
        return base.assign(target=[[int(s0)] * len(e) for s0, e in zip(base.s0, base.encoded)])
    return base.assign(target=[base_chain(r, epsilon) for r in base.itertuples(index=False)])


def _with_ci(prefix: str, d: dict) -> dict:
    return {prefix: d["rate"], f"{prefix} lo": d["lo"], f"{prefix} hi": d["hi"]}


def controllability_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Does a step follow the state it was generated under? Per (backbone, dataset, eta, config)
    other than Base: the fraction of steps whose state re-encoded by Q_phi equals the state the step
    was generated under ("follows"), against chance 1/K and against Base steps paired with random
    states ("Base, random states": for CTRLS(epsilon) a chain drawn from the same epsilon-greedy
    policy from the prompt's s_0, for "fixed s0" the prompt's s_0 at every step), with the paired
    difference follows − Base. Rates are fractions of steps with 95% Wilson intervals at the
    question-clustered effective size, the difference Newcombe's paired interval at the family level
    1 - 0.05/m over the table's m rows with a permutation p-value (``ctrls.generate.controllability``),
    Holm-adjusted over the same rows ("p (Holm)")."""
    need = {"encoded", "s0", "n_states", "chains", "chain_eps"} - set(df.columns)
    if need:
        raise ValueError(f"the exploration samples lack the columns {sorted(need)}: rerun the exploration stage "
                         f"(--force exploration) to re-encode their steps")
    out, pairs = [], []
    for (b, ds, eta), grp in df.groupby(["backbone", "dataset", "temperature"], sort=False):
        base = grp[grp.config == BASE]
        for label, g in sorted(grp[grp.config != BASE].groupby("config", sort=False), key=lambda kv: _row_order(kv[0])):
            k = int(g.n_states.iloc[0])
            steps = _flat_steps(g, "states")
            row = {"backbone": b, "dataset": ds, "temperature": eta, "config": label, "K": k, "chance": 1.0 / k}
            ours = ctl.match_rate(*steps, n_boot=n_boot, seed=seed)
            row.update({"questions": ours["questions"], "steps": ours["steps"], **_with_ci("follows", ours)})
            if not base.empty:
                eps = float(g.epsilon.iloc[0]) if label != FIXED else math.nan
                bsteps = _flat_steps(_base_targets(base, label, eps), "target")
                ref = ctl.match_rate(*bsteps, n_boot=n_boot, seed=seed)
                row.update({"Base steps": ref["steps"], **_with_ci("Base, random states", ref)})
                if set(map(str, steps[2])) == set(map(str, bsteps[2])):
                    pairs.append((len(out), steps, bsteps))
                if label != FIXED:  # kappa against the independent-chain null (fixed s0 has none: its chain is s0)
                    kv = kappa_vs_null(*null_steps(g, base, eps), n_boot=n_boot, seed=seed)
                    row.update({"null": kv["null"], "null steps": kv["steps"], "κ": kv["kappa"], "κ lo": kv["kappa lo"],
                                "κ hi": kv["kappa hi"], "p (κ)": kv["p_value"]})
            out.append(row)
    for i, steps, bsteps in pairs:  # the family: every row compared with Base; intervals at 1 - ALPHA / family
        d = ctl.match_rate_difference(steps, bsteps, n_boot=n_boot, alpha=ALPHA / len(pairs), seed=seed)
        out[i].update({"Δ vs Base": d["diff"], "Δ lo": d["lo"], "Δ hi": d["hi"], "p": d["p_value"],
                       "family": len(pairs)})
    t = pd.DataFrame(out)
    if "p" in t:
        t["p (Holm)"] = holm(t["p"])  # the family: every row compared with Base
    if "p (κ)" in t:
        has = t["p (κ)"].notna()
        t.loc[has, "p (κ, Holm)"] = holm(t.loc[has, "p (κ)"])  # the family: the epsilon rows' kappas
    return t


def diversity_table(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Diversity per (backbone, dataset, eta, config), each a mean over questions with a 95%
    bootstrap interval: the number of distinct final answers among a question's samples
    (``answers.normalize``d, no-answer samples not counted); the entropy (bits) of the states its
    samples' steps visit, as re-encoded by Q_phi (every row, Base included); and for CTRLS rows the
    entropy of the states drawn for them (for "fixed s0" fixed by construction, one state at every
    step: printed as such, its bounds NaN). Entropies are plug-in estimates over a question's pooled
    steps, biased low (``ctrls.generate.controllability``)."""
    out = []
    for (b, ds, eta, label), g in df.groupby(["backbone", "dataset", "temperature", "config"], sort=False):
        by_q = [q for _, q in g.groupby("question_id", sort=True)]
        answers = [[normalize(p) if v and isinstance(p, str) else None for p, v in zip(q.pred, q.valid)] for q in by_q]
        row = {"backbone": b, "dataset": ds, "temperature": eta, "config": label, "questions": len(by_q),
               "samples": int(g.groupby("question_id").size().max())}
        for name, values in (("distinct answers", ctl.distinct_answers(answers)),
                             ("encoded-state entropy (bits)",
                              ctl.state_entropy([list(q.encoded) for q in by_q]) if "encoded" in g else None),
                             ("drawn-state entropy (bits)",
                              ctl.state_entropy([list(q.states) for q in by_q]) if label != BASE else None)):
            if values is None:
                continue
            m, lo, hi = ctl.mean_with_ci(values, n_boot=n_boot, seed=seed)
            if name == "drawn-state entropy (bits)" and label == FIXED:
                lo = hi = math.nan  # fixed by construction (one state, s_0, at every step): no interval
            row.update({name: m, f"{name} lo": lo, f"{name} hi": hi})
        out.append(row)
    t = pd.DataFrame(out)
    t["_o"] = t.config.map(_row_order)
    return t.sort_values(["backbone", "dataset", "temperature", "_o"]).drop(columns="_o").reset_index(drop=True)


def pass_at_k_curves(df: pd.DataFrame) -> pd.DataFrame:
    """Unbiased pass@k for k = 1..n per (backbone, dataset, eta, config)."""
    out = []
    for keys, g in df.groupby(["backbone", "dataset", "temperature", "config"], sort=False):
        c = matrices(g, "correct")
        for k in range(1, c.shape[1] + 1):
            out.append(dict(zip(["backbone", "dataset", "temperature", "config"], keys), k=k, pass_at_k=pass_at_k(c, k)))
    return pd.DataFrame(out)


def layout(t: pd.DataFrame) -> pd.DataFrame:
    """Our Table 1 in the paper's layout: rows (eta, config), columns (backbone · dataset, metric)."""
    t = with_pct_ci(t).assign(model=t.backbone.str.split("/").str[-1] + " · " + t.dataset)
    wide = t.pivot_table(index=["temperature", "config"], columns="model", values=["pass@n (%)", "Succ. (%)"],
                         aggfunc="first", sort=False)
    wide = wide.swaplevel(0, 1, axis=1).sort_index(axis=1, level=0, sort_remaining=False)
    wide.index = wide.index.set_names(["η", "exploration"])
    return wide.fillna("not run")  # a row a dataset has no samples for (the transfer rows run CTRLS and Base only)


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
        parts.append(f"**{r.pair}**: {r.correct} of {r.trajectories} training trajectories were rewarded "
                     f"({r['reward rate']:.1%}, 95% CI {lo:.1%}–{hi:.1%}; {r.runs} runs × {cfg.rl.steps} steps)")
    text = "Measured reward rate on the real backbone: " + "; ".join(parts) + "."
    if len(rates) and (rates["reward rate"] < low).all():
        text += (f" With under {low:.0%} of trajectories rewarded, almost every return is 0 (plus the entropy term "
                 "α·ΣH), so the REINFORCE gradient carries almost no information about correctness: flat accuracy "
                 "curves are what this size is expected to give, not a finding about CTRLS. How the policy learns, "
                 "explores and collapses is studied where the reward is informative and the optimum known: "
                 f"{synthetic_link()}.")
    else:
        text += (" For the learning dynamics against a known optimum, see "
                 f"{synthetic_link()}.")
    return text


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


def _row_order(label: str) -> float:
    """Table order: Base, fixed s0, then epsilon ascending, then anything else."""
    if label == BASE:
        return -2.0
    if label == FIXED:
        return -1.0
    try:
        return float(label.split("=")[1]) if label.startswith("eps=") else 99.0
    except ValueError:
        return 99.0
