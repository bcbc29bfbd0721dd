"""Conclusions computed, not typed: the "What this run shows" boxes of the run pages and the claims
scorecard of the book's first page.

Every sentence is written from a table the pages also show. A paired difference is *higher* / *lower*
only when its Holm-adjusted p < 0.05 *and* its family interval (Newcombe's at 1 - 0.05/m, Bonferroni)
excludes 0; otherwise *no detectable difference*, with the estimate's direction. The scorecard says
*supported*, *contradicted* or *not supported* (the one label for an unresolved estimate), beside the
demo's minimal detectable difference; :func:`rl_verdicts` compares held-out accuracy at the end with
step 0 (*learned*, *got worse*, *no detectable change*), conditional on the runs. The rules in full:
book/method.md, "ctrls/report/verdicts.py".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ctrls.report.display import MISSING
from ctrls.report.words import say
from ctrls.stats.metrics import format_p, holm, paired_rate_difference

ALPHA = 0.05


def _missing(*v) -> bool:
    return any(x is None or (isinstance(x, (float, np.floating)) and math.isnan(x)) for x in v)


def _absent(*v) -> bool:
    """Whether any value is missing by any of pandas's or numpy's names for it (None, NaN, pd.NA, NaT)."""
    return any(x is None or (pd.api.types.is_scalar(x) and bool(pd.isna(x))) for x in v)


def pts(d: float, lo: float, hi: float) -> str:
    """A difference of fractions in points with its interval: "+3.1 points [−8.0, +14.2]"; the book's
    missing marker (``ctrls.report.display.MISSING``) when a value is missing."""
    if _absent(d, lo, hi):
        return MISSING
    return f"{100 * float(d):+.1f} points [{100 * float(lo):+.1f}, {100 * float(hi):+.1f}]".replace("-", "−")


def pct(v: float, lo: float | None = None, hi: float | None = None) -> str:
    """A fraction in percent, with its interval when given: "25.0% [10.0, 40.0]"; the book's missing
    marker when a value is missing (an interval given with a missing end included)."""
    interval = lo is not None or hi is not None
    if _absent(v) or (interval and _absent(lo, hi)):
        return MISSING
    s = f"{100 * float(v):.1f}%"
    return f"{s} [{100 * float(lo):.1f}, {100 * float(hi):.1f}]" if interval else s


NOT_SUPPORTED = "not supported"  # the one label, on every page and in the scorecard, for an unresolved estimate


def _estimate(d: float, scale: float, unit: str) -> str:
    return f"{scale * d:+.1f}{' ' + unit if unit else ''}".replace("-", "−")


def _resolved(p_adj: float, lo: float | None, hi: float | None) -> tuple[bool, str]:
    """(resolved, note): resolved when the Holm-adjusted p < ALPHA and, where an interval is given,
    it excludes 0 as well (the two are on the same footing: the family interval); the note names a
    disagreement of the two, so an interval that excludes 0 never stands beside a bare "no
    detectable difference"."""
    sig = p_adj < ALPHA
    if lo is None or hi is None or _missing(lo, hi):
        return sig, ""
    excl = lo > 0 or hi < 0
    if sig == excl:
        return sig, ""
    return False, ("; the family interval excludes 0 but the Holm-adjusted test does not reject" if excl else
                   "; the Holm-adjusted test rejects but the family interval includes 0")


def _check(d: float, p_adj: float) -> bool:
    if _missing(p_adj):
        return False
    if _missing(d):
        raise ValueError(f"a verdict needs an estimate: the difference is {d} beside p = {p_adj}")
    if not 0 <= p_adj <= 1:
        raise ValueError(f"an adjusted p-value must lie in [0, 1], got {p_adj}")
    return True


def direction(d: float, p_adj: float, up: str = "higher", down: str = "lower",
              none: str = "no detectable difference", lo: float | None = None, hi: float | None = None,
              scale: float = 100.0, unit: str = "points") -> str:
    """The verdict of a difference d from its Holm-adjusted p-value and, when given, its family
    interval (lo, hi): ``up``/``down`` when both resolve it, else ``none`` with the estimate's
    direction, e.g. "no detectable difference (the estimate is lower: −22.5 points)". "not computed"
    when the p-value is missing. A p-value without an estimate (d NaN), or one outside [0, 1], is an
    error: a NaN estimate would otherwise read as "lower"."""
    if not _check(d, p_adj):
        return "not computed"
    ok, note = _resolved(p_adj, lo, hi)
    if ok:
        return up if d > 0 else down
    way = "higher" if d > 0 else "lower" if d < 0 else "zero"
    return say("verdicts", "direction.unresolved", none=none, way=way, estimate=_estimate(d, scale, unit), note=note)


def claim_verdict(d: float, p_adj: float, side: int = 1, lo: float | None = None, hi: float | None = None,
                  scale: float = 100.0, unit: str = "points") -> str:
    """'supported' / 'contradicted' for a claimed direction ``side`` (+1: a rise, -1: a fall) that
    the test and the family interval resolve; otherwise the one label for an unresolved estimate,
    *not supported*, with the estimate's direction: "not supported: the estimate is in the opposite
    direction (−22.5 points)" or "... in the claimed direction (+3.1 points)". Errors as
    :func:`direction`."""
    if side not in (1, -1):
        raise ValueError(f"side must be +1 (a claimed rise) or -1 (a claimed fall), got {side}")
    if not _check(d, p_adj):
        return "not computed"
    ok, note = _resolved(p_adj, lo, hi)
    if ok:
        return "supported" if side * d > 0 else "contradicted"
    way = (say("verdicts", "claim.way.claimed") if side * d > 0 else say("verdicts", "claim.way.opposite") if side * d < 0
           else "zero")
    return say("verdicts", "claim.unresolved", label=NOT_SUPPORTED, way=way, estimate=_estimate(d, scale, unit), note=note)


def box(sentences: list[str], title: str = "What this run shows") -> str:
    """A Markdown box (a block quote) with one bullet per sentence."""
    body = "\n".join(f"> - {s}" for s in sentences) if sentences else "> - Nothing to report: no results were found."
    return f"> **{title}.**\n>\n{body}\n"


# ---- exploration (Table 1, ablation, controllability) -----------------------------------------


def exploration_sentences(table: pd.DataFrame, ablation: pd.DataFrame, control: pd.DataFrame) -> list[str]:
    """Sentences from ``tables.table1``, ``tables.ablation_table`` and ``tables.controllability_table``,
    each naming its dataset and temperature."""
    return [s for _, _, s in _exploration_items(table, ablation, control)]


def exploration_highlights(table: pd.DataFrame, ablation: pd.DataFrame,
                           control: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The page's box: the three sentences that matter, and the others (to fold). The three: CTRLS
    against Base in Table 1 (the row with the smallest Holm-adjusted p, then the largest |Δ|), the
    adapter alone (the first ablation's pass@n) and whether steps follow their states (the first
    controllability row); each kind that has no row is left out."""
    items = _exploration_items(table, ablation, control)
    keep = []
    for kind in ("table1", "ablation", "control"):
        cands = [(i, key) for i, (k, key, _) in enumerate(items) if k == kind]
        if cands:
            keep.append(min(cands, key=lambda c: c[1])[0])
    keep = sorted(keep)
    return [items[i][2] for i in keep], [s for i, (_, _, s) in enumerate(items) if i not in keep]


def _exploration_items(table: pd.DataFrame, ablation: pd.DataFrame, control: pd.DataFrame) -> list[tuple]:
    """(kind, sort key: smaller matters more, sentence) for every sentence of the exploration page."""
    import math

    def key(p, d, order):
        p = 1.0 if p is None or (isinstance(p, float) and math.isnan(p)) else float(p)
        d = 0.0 if d is None or (isinstance(d, float) and math.isnan(d)) else abs(float(d))
        return (p, -d, order)

    out = []
    base = table[table.config == "Base"]
    where = lambda r: say("verdicts", "cases.where", dataset=r.dataset, eta=format(r.temperature, "g"))  # noqa: E731
    for _, b in base.iterrows():
        out.append(("base", (), say("verdicts", "exploration.base", where=where(b), questions=b.questions, samples=b.samples,
                                    **{"pass": pct(b["pass@n"], b["pass@n lo"], b["pass@n hi"]),
                                       "succ": pct(b.succ, b["succ lo"], b["succ hi"])})))
    for n, (_, r) in enumerate(table[table.p.notna()].iterrows()):
        v = direction(r["Δ pass@n vs Base"], r["p (Holm)"], lo=r["Δ lo"], hi=r["Δ hi"])
        b = base[(base.dataset == r.dataset) & (base.temperature == r.temperature)]["pass@n"]
        vs = say("verdicts", "exploration.vs", base=pct(b.iloc[0])) if len(b) else ""
        out.append(("table1", key(r["p (Holm)"], r["Δ pass@n vs Base"], n),
                    say("verdicts", "exploration.table1", where=where(r), config=r.config, samples=r.samples, vs=vs,
                        diff=pts(r["Δ pass@n vs Base"], r["Δ lo"], r["Δ hi"]), p=format_p(r["p (Holm)"]), verdict=v,
                        **{"pass": pct(r["pass@n"])})))
    for n, (_, r) in enumerate(ablation.iterrows()):
        for m in ("pass@n", "Succ."):
            d, lo, hi, p = (r["Δ " + m], r["Δ " + m + " lo"], r["Δ " + m + " hi"], r["p (" + m + ", Holm)"])
            out.append(("ablation" if m == "pass@n" else "ablation succ", (n,),
                        say("verdicts", "exploration.ablation", where=where(r), comparison=r.comparison, metric=m,
                            diff=pts(d, lo, hi), p=format_p(p), verdict=direction(d, p, lo=lo, hi=hi))))
    if "Δ vs Base" in control:
        for n, (_, r) in enumerate(control[control["Δ vs Base"].notna()].iterrows()):
            v = direction(r["Δ vs Base"], r["p (Holm)"], lo=r["Δ lo"], hi=r["Δ hi"])
            out.append(("control", (n,), say("verdicts", "exploration.control", where=where(r), config=r.config,
                                             follows=pct(r["follows"]), steps=r.steps, base=pct(r["Base, random states"]),
                                             chance=pct(r.chance), diff=pts(r["Δ vs Base"], r["Δ lo"], r["Δ hi"]),
                                             p=format_p(r["p (Holm)"]), verdict=v)))
            if "κ" in r and not _missing(r["κ"]):  # the claim's own test: the independent-chain null
                kv = direction(r["κ"], r["p (κ, Holm)"], lo=r["κ lo"], hi=r["κ hi"])
                out.append(("control", (n, 1), say("verdicts", "exploration.kappa", where=where(r), config=r.config,
                                                   null=pct(r["null"]), steps=int(r["null steps"]),
                                                   kappa=format(r["κ"], ".2f"), lo=format(r["κ lo"], ".2f"),
                                                   hi=format(r["κ hi"], ".2f"), p=format_p(r["p (κ, Holm)"]), verdict=kv)))
    return out


# ---- RL -------------------------------------------------------------------------------------


def rl_verdicts(curves: pd.DataFrame) -> pd.DataFrame:
    """Per (pair, setting): held-out accuracy at step 0 and at the last evaluation, their paired
    difference over the evaluation questions (seeds pooled per question), Newcombe's interval, a
    permutation p, Holm over the settings, and the verdict (module docstring)."""
    ev = curves[curves.kind == "eval"]
    if "correct_by_question" not in ev:
        raise ValueError("the RL curves have no per-question results (correct_by_question): rerun the RL stage")
    rows, arrays = [], []
    for (pair, setting), g in ev.groupby(["pair", "setting"], sort=False):
        first, last = g.step.min(), g.step.max()
        seeds = sorted(g.seed.unique())
        if last == first:
            continue

        def pooled(step: int) -> tuple[np.ndarray, np.ndarray]:
            at = g[g.step == step].sort_values("seed")
            m = np.sum([np.asarray(x, float) for x in at.correct_by_question], axis=0)
            n = np.full(len(m), float(at.samples_per_question.sum()))
            return m, n

        (m1, n1), (m0, n0) = pooled(last), pooled(first)
        c = paired_rate_difference(m1, n1, m0, n0)
        arrays.append((m1, n1, m0, n0))
        rows.append({"pair": pair, "setting": setting, "seeds": len(seeds), "last step": int(last),
                     "questions": len(m0), "samples per question": int(n0[0]),
                     "accuracy at step 0": m0.sum() / n0.sum(), "accuracy at the end": m1.sum() / n1.sum(),
                     "Δ": c["diff"], "Δ lo": c["lo"], "Δ hi": c["hi"], "p": c["p_value"]})
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    t["p (Holm)"] = holm(t.p)
    t["family"] = len(t)  # the interval: Newcombe's at 1 - 0.05 / family (Bonferroni), on Holm's footing
    for i, a in enumerate(arrays):
        c = paired_rate_difference(*a, alpha=ALPHA / len(t))
        t.loc[i, ["Δ lo", "Δ hi"]] = c["lo"], c["hi"]
    t["verdict"] = [direction(d, p, "learned", "got worse", "no detectable change", lo, hi)
                    for d, p, lo, hi in zip(t["Δ"], t["p (Holm)"], t["Δ lo"], t["Δ hi"])]
    return t


def rl_verdicts_view(t: pd.DataFrame) -> pd.DataFrame:
    """:func:`rl_verdicts` for the book: rates in %, the difference in points with its family interval."""
    return pd.DataFrame({"setting": t.setting, "seeds": t.seeds, "steps": t["last step"], "questions": t.questions,
                         "samples / question": t["samples per question"],
                         "accuracy at step 0 (%)": (100 * t["accuracy at step 0"]).round(1),
                         "accuracy at the end (%)": (100 * t["accuracy at the end"]).round(1),
                         "Δ (pts, family 95% CI)": [pts(*x) for x in zip(t["Δ"], t["Δ lo"], t["Δ hi"])],
                         "p (Holm)": t["p (Holm)"].map(format_p), "verdict": t.verdict})


def rl_sentences(t: pd.DataFrame) -> list[str]:
    return [say("verdicts", "rl", setting=r.setting, seeds=r.seeds, steps=r["last step"], start=pct(r["accuracy at step 0"]),
                end=pct(r["accuracy at the end"]), diff=pts(r["Δ"], r["Δ lo"], r["Δ hi"]), questions=r.questions,
                p=format_p(r["p (Holm)"]), verdict=r.verdict) for _, r in t.iterrows()]


# ---- pretraining and case studies ---------------------------------------------------------------


def pretraining_sentences(collect: dict, bound: pd.DataFrame | None = None) -> list[str]:
    """From the collect stage's summary (questions, sampled, sampled_correct, reference, kept) and,
    when given, the bound table (rows per split with a per-step bound column)."""
    out = []
    s, c = collect.get("sampled", 0), collect.get("sampled_correct", 0)
    if s:
        from ctrls.stats.power import wilson_interval

        lo, hi = wilson_interval(c, s)
        out.append(say("verdicts", "pretraining.sampled", correct=c, sampled=s, rate=pct(c / s, lo, hi)))
    out.append(say("verdicts", "pretraining.kept", kept=collect.get("kept", 0), questions=collect.get("questions", 0),
                   reference=collect.get("reference", 0), correct=c))
    if bound is not None and not bound.empty:
        out.extend(bound_sentences(bound))
    return out


def bound_sentences(bound: pd.DataFrame) -> list[str]:
    """One sentence on the train vs held-out bound per step, when the table has both."""
    cols = [c for c in bound.columns if "per step" in str(c)]
    if "split" not in bound or not cols:
        return []
    col = cols[0]
    vals = {r.split: r[col] for _, r in bound.iterrows()}
    if {"train", "held-out"} <= set(vals):
        return [say("verdicts", "bound", train=format(vals["train"], ".3f"), held=format(vals["held-out"], ".3f"), column=col)]
    return []


def case_sentences(samples: pd.DataFrame, config: str) -> list[str]:
    """Per dataset and temperature (never pooled across datasets: a question id of one dataset says
    nothing of another's), how often CTRLS row ``config`` and Base disagree on solving a question
    (any sample correct)."""
    out = []
    keys = ["dataset", "temperature"] if "dataset" in samples else ["temperature"]
    for key, g in samples.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        ds, eta = (key if len(key) == 2 else (None, key[0]))
        solved = g.groupby(["config", "question_id"]).correct.any().unstack(0)
        if config not in solved or "Base" not in solved:
            continue
        solved = solved[[config, "Base"]].dropna().astype(bool)  # questions both rows were run on
        only_c = int((solved[config] & ~solved["Base"]).sum())
        only_b = int((~solved[config] & solved["Base"]).sum())
        where = (say("verdicts", "cases.where", dataset=ds, eta=format(eta, "g")) if ds is not None else
                 say("verdicts", "cases.where.eta", eta=format(eta, "g")))
        out.append(say("verdicts", "cases", where=where, config=config, only_c=only_c, only_b=only_b, n=len(solved),
                       questions="question" if only_c == 1 else "questions"))
    return out


# ---- the scorecard --------------------------------------------------------------------------

PAPER, OWN = "paper", "own"  # the scorecard's two blocks: the paper's claims; this book's own checks
BLOCKS = {PAPER: "The paper's claims", OWN: "This book's own checks"}
LABELS = ("supported", "contradicted", "mixed", NOT_SUPPORTED, "not run", "no comparison in this profile",
          "not computed", "unreadable")


@dataclass
class Estimate:
    """One difference behind a claim: what is compared, the estimate and its family interval, in
    points (``scale`` 100, ``unit`` "points") or in the quantity's own unit."""
    label: str
    d: float
    lo: float
    hi: float
    scale: float = 100.0
    unit: str = "points"

    @property
    def arrow(self) -> str:
        """↑ (above 0), ↓ (below 0), = (0), ? (not computed)."""
        if _missing(self.d):
            return "?"
        return "↑" if self.d > 0 else "↓" if self.d < 0 else "="

    def text(self, label: bool = True) -> str:
        """"↑ +3.1 points [−8.0, +14.2]", with the label first when asked."""
        if _missing(self.d, self.lo, self.hi):
            size = "not computed"
        else:
            f = lambda x: f"{self.scale * x:+.1f}" if self.scale != 1 else f"{x:+.2f}"  # noqa: E731
            size = (f"{f(self.d)}{' ' + self.unit if self.unit else ''} [{f(self.lo)}, {f(self.hi)}]").replace("-", "−")
        return f"{self.label}: {self.arrow} {size}" if label and self.label else f"{self.arrow} {size}"


@dataclass
class Claim:
    claim: str
    source: str  # where the paper makes it
    evidence: str
    verdict: str
    page: str  # the book page (docname) with the evidence
    block: str = PAPER  # PAPER: one of the paper's claims; OWN: one of this book's own checks
    claimed: str = ""  # the claimed direction, e.g. "↑ CTRLS − Base"
    estimates: list = field(default_factory=list)  # the Estimates the verdict is read from
    mdd: float | None = None  # the demo's minimal detectable difference (points), when the verdict is unresolved
    beside: list = field(default_factory=list)  # Estimates reported beside the claim, not in its verdict

    @property
    def label(self) -> str:
        return verdict_label(self.verdict)

    def found(self) -> str:
        """The estimates' direction and size, short (labels only where there are several)."""
        if not self.estimates:  # nothing measured: why (not run, no comparison, unreadable), or the evidence itself
            return self.evidence or "–"
        text = "; ".join(e.text(label=len(self.estimates) > 1) for e in self.estimates)
        return text + (say("verdicts", "found.detectable", mdd=format(self.mdd, ".0f")) if self.mdd is not None and not
                       math.isnan(self.mdd) and self.label == NOT_SUPPORTED else "")


def verdict_label(verdict: str) -> str:
    """The verdict cell: the label alone ("not supported", "unreadable", ...), without the sentence the
    verdict carries (its direction and size are the scorecard's own columns); a verdict that is none
    of ``LABELS`` is returned as it is."""
    return next((lab for lab in LABELS if verdict == lab or verdict.startswith(lab + ":")), verdict)


def page_link(page: str) -> str:
    """A link to a book page showing the page's own title (MyST ``{doc}`` without text)."""
    return f"{{doc}}`/{page}`"


def scorecard_markdown(claims: list[Claim], where: str) -> str:
    """The scorecard in two blocks (:data:`BLOCKS`: the paper's claims, then this book's own checks),
    each a Markdown table with the claim, a short verdict, the direction and size found, the claimed direction
    and the page (by its title), with a line naming the run behind it."""
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = [f"*{where}*", ""]
    for block, title in BLOCKS.items():
        rows = [c for c in claims if c.block == block]
        if not rows:
            continue
        # claim, verdict and estimate first: on a phone the table scrolls, and those are what a reader needs
        lines += [f"### {title}", "", "| claim | verdict | found: direction, size (family 95% CI) | claimed | page |",
                  "|---|---|---|---|---|"]
        for c in rows:
            lines.append(f"| {esc(c.claim)} ({esc(c.source)}) | **{esc(c.label)}** | {esc(c.found())} | "
                         f"{esc(c.claimed or '–')} | {page_link(c.page)} |")
        lines.append("")
    return "\n".join(lines)
