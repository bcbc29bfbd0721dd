"""Tables 1 and 3's companions computed from a stage's samples: Table 1 (pass@n and Succ. per row, paired
against Base), the no-transition ablation, controllability (does a step follow its state; kappa against the
independent-chain null) and diversity, the pass@k curves, and one run's numbers of the method's claims
(``run_numbers``). Each takes the samples frame the exploration
stage writes (``ctrls.stages.exploration.load_samples``) and returns a DataFrame with n and 95% intervals,
every interval and test from ``ctrls.stats``; the book lays them out (``ctrls.report.tables``) and the
studies compute with them.

Rates (pass@n, Succ., match rates) carry Wilson score intervals and paired differences Newcombe's
paired interval (``ctrls.stats.metrics``, sound at 0% and 100%); p-values are exact McNemar or
within-question permutation p-values. Where a page draws verdicts from a table's family of comparisons
(Table 1's rows against Base, the ablation, the controllability rows), the table adds Holm-adjusted
p-values (``metrics.holm``) over that family, and its difference intervals are *family* intervals:
Newcombe's paired interval at level 1 - 0.05/m over the family's m comparisons (Bonferroni, simultaneous
95%). Each comparison belongs to one family: fixed s0 − Base is the ablation's, not Table 1's.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ctrls.config.settings import BASE, FIXED, row_label
from ctrls.data.answers import normalize
from ctrls.generate import controllability as ctl
from ctrls.stats.agreement import base_chain, kappa_vs_null, null_steps
from ctrls.stats.metrics import holm, paired_rate_difference, pass_at_k, rate_interval
from ctrls.stats.paired import paired_pass


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
    t["_o"] = t.config.map(row_order)
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
        labels = sorted(grp.config.unique(), key=row_order)
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
        for label, g in sorted(grp[grp.config != BASE].groupby("config", sort=False), key=lambda kv: row_order(kv[0])):
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
    t["_o"] = t.config.map(row_order)
    return t.sort_values(["backbone", "dataset", "temperature", "_o"]).drop(columns="_o").reset_index(drop=True)


def pass_at_k_curves(df: pd.DataFrame) -> pd.DataFrame:
    """Unbiased pass@k for k = 1..n per (backbone, dataset, eta, config)."""
    out = []
    for keys, g in df.groupby(["backbone", "dataset", "temperature", "config"], sort=False):
        c = matrices(g, "correct")
        for k in range(1, c.shape[1] + 1):
            out.append(dict(zip(["backbone", "dataset", "temperature", "config"], keys), k=k, pass_at_k=pass_at_k(c, k)))
    return pd.DataFrame(out)


def row_order(label: str) -> float:
    """Table order: Base, fixed s0, then epsilon ascending, then anything else."""
    if label == BASE:
        return -2.0
    if label == FIXED:
        return -1.0
    try:
        return float(label.split("=")[1]) if label.startswith("eps=") else 99.0
    except ValueError:
        return 99.0


PASS_K = 4  # the k of the unbiased pass@k compared (the summary page's power design: 8 samples, pass@4)


def run_numbers(samples: pd.DataFrame, epsilon: float, k: int | None = None, margin: float = 5.0,
                seed: int = 0) -> dict:
    """The numbers of the module docstring for one dataset's exploration samples (Base, fixed s0 and the
    CTRLS(epsilon) row, each with the same questions and samples); ``margin``: the harm's non-inferiority
    margin in points, judged on the interval's lower bound."""
    base, fixed, row = (samples[samples.config == c] for c in (BASE, FIXED, row_label(epsilon)))
    for name, g in ((BASE, base), (FIXED, fixed), (row_label(epsilon), row)):
        if g.empty:
            raise ValueError(f"the samples have no {name!r} row (rerun the exploration stage with grid.fixed_state)")
    m = int(row.groupby("question_id").size().min())
    k = min(PASS_K, m) if k is None else k
    harm = paired_pass(fixed, base, 1, seed=seed)
    harm["non_inferior"] = bool(harm["lo"] > -margin / 100)
    return {"questions": int(row.question_id.nunique()), "samples_per_question": m, "epsilon": float(epsilon),
            "kappa": kappa_vs_null(*null_steps(row, base, epsilon), seed=seed),
            "harm_fixed_minus_base_pass1": harm,
            "eps_minus_fixed_pass1": paired_pass(row, fixed, 1, seed=seed),
            f"eps_minus_fixed_pass{k}": paired_pass(row, fixed, k, seed=seed),
            f"eps_minus_base_pass{k}": paired_pass(row, base, k, seed=seed),
            "pass1": {BASE: float(base.correct.mean()), FIXED: float(fixed.correct.mean()),
                      row_label(epsilon): float(row.correct.mean())}}
