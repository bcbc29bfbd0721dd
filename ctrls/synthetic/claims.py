"""The synthetic study's verdicts on the paper's claims (``ctrls.synthetic.chain``): intervals over seeds
that respect each quantity's range, a stated collapse threshold, a tested recovery rate, and Holm's
adjustment over the family of claims.

:func:`welch_interval`: Wilson / Newcombe for counts of seeds, Welch t where both sides vary, MOVER
otherwise, inside the quantity's range (``bounds``) and never a point. A claim's p-value is the smallest
alpha at which its interval excludes the null; verdicts (*supported*, *contradicted*, *not supported*)
come from Holm-adjusted p-values beside a Bonferroni family interval. Collapse: the start-state entropy
below ``COLLAPSE_FRACTION`` x log K and below the entropy runs' (intersection-union). Recovery (the paper
claims no rate: Alg. 1 fits P_theta "via KL", Sec. 5.3 and Thm. 5.3 define the bound): a TOST that the
error's log-log slope lies within ``RATE_MARGIN`` of -0.5. In full: book/method.md,
"ctrls/synthetic/claims.py".
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from ctrls.config.schema import Config
from ctrls.stats.metrics import holm
from ctrls.stats.power import wilson_interval

COLLAPSE_FRACTION = 0.1  # a start-state row with entropy below 10% of log K counts as collapsed
RATE = -0.5  # the parametric rate of the transition fit's error (log TV error vs log chains)
RATE_MARGIN = 0.25  # the recovery claim holds when the slope lies within this of RATE
ALPHA = 0.05


def _two_valued(x: np.ndarray, bounds: tuple[float, float]) -> bool:
    """Every seed at one of the range's two ends: a count of seeds (book/method.md)."""
    lo_b, hi_b = bounds
    return bool(np.all(np.isclose(x, lo_b, rtol=0, atol=1e-9) | np.isclose(x, hi_b, rtol=0, atol=1e-9)))


def _side_interval(x: np.ndarray, level: float, bounds: tuple[float, float]) -> tuple[float, float, float]:
    """(mean, lo, hi) of one side over seeds (book/method.md): Wilson for a count of seeds, t for a
    varying side (clipped to the range), the whole range for a side without spread."""
    lo_b, hi_b = bounds
    n, xbar = len(x), float(x.mean())
    if _two_valued(x, bounds):
        k = int(np.isclose(x, hi_b, rtol=0, atol=1e-9).sum())
        wl, wh = wilson_interval(k, n, 1 - level)
        return xbar, lo_b + (hi_b - lo_b) * wl, lo_b + (hi_b - lo_b) * wh
    s2 = float(x.var(ddof=1)) if n > 1 else 0.0
    if s2 <= 0:
        return xbar, lo_b, hi_b  # the same value on every seed: no spread, no information
    h = stats.t.ppf(0.5 + level / 2, n - 1) * math.sqrt(s2 / n)
    return xbar, max(lo_b, xbar - h), min(hi_b, xbar + h)


def _welch(a: np.ndarray, b: np.ndarray | None, level: float) -> tuple[float, float, float]:
    """The Welch t interval of mean(a) - mean(b) (of mean(a) when b is None); (-inf, inf) without spread."""
    if b is None:
        d, var, df = a.mean(), (a.var(ddof=1) / len(a) if len(a) > 1 else 0.0), len(a) - 1
    else:
        va = a.var(ddof=1) / len(a) if len(a) > 1 else 0.0
        vb = b.var(ddof=1) / len(b) if len(b) > 1 else 0.0
        d, var = a.mean() - b.mean(), va + vb
        df = var ** 2 / ((va ** 2 / (len(a) - 1) if len(a) > 1 else 0) + (vb ** 2 / (len(b) - 1) if len(b) > 1 else 0)) \
            if var > 0 else 1
    if not var > 0:
        return float(d), -math.inf, math.inf  # no spread over seeds: no information, never a point
    h = stats.t.ppf(0.5 + level / 2, df) * math.sqrt(var)
    return float(d), float(d - h), float(d + h)


def welch_interval(a: Sequence[float], b: Sequence[float] | None = None, level: float = 0.95,
                   bounds: tuple[float, float] | None = None) -> tuple[float, float, float]:
    """(d, lo, hi): mean(a) - mean(b) over seeds (b = None: mean(a)). With ``bounds`` (the range of
    one observation) an interval read from the data that stays in range and is never a point:
    binomial for counts of seeds, Welch where both sides vary, else square-and-add of each side's
    own (book/method.md); without, the Welch t interval, (-inf, inf) where both variances are 0."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    a = np.asarray(a, dtype=float)
    bb = None if b is None else np.asarray(b, dtype=float)
    if len(a) == 0 or (bb is not None and len(bb) == 0):
        raise ValueError("welch_interval needs at least one value on each side")
    for x in (a,) if bb is None else (a, bb):
        if not np.isfinite(x).all():
            raise ValueError(f"welch_interval: values {x.tolist()} are not all finite")
    if bounds is None:
        return _welch(a, bb, level)
    lo_b, hi_b = bounds
    for x in (a,) if bb is None else (a, bb):
        if ((x < lo_b - 1e-9) | (x > hi_b + 1e-9)).any():
            raise ValueError(f"values {x.tolist()} outside the stated range [{lo_b}, {hi_b}]")
    if bb is None:
        if _two_valued(a, bounds) or len(a) < 2 or a.var(ddof=1) <= 0:
            return _side_interval(a, level, bounds)
        d, lo, hi = _welch(a, None, level)
        return d, max(lo_b, lo), min(hi_b, hi)
    width = hi_b - lo_b
    varies = lambda x: not _two_valued(x, bounds) and len(x) > 1 and x.var(ddof=1) > 0  # noqa: E731
    if varies(a) and varies(bb):
        d, lo, hi = _welch(a, bb, level)
        return d, max(-width, lo), min(width, hi)
    ma, la, ua = _side_interval(a, level, bounds)
    mb, lb, ub = _side_interval(bb, level, bounds)
    d = float(ma - mb)  # MOVER; for two counts of seeds this is Newcombe's method 10
    return d, max(-width, d - math.hypot(ma - la, ub - mb)), min(width, d + math.hypot(ua - ma, mb - lb))


def interval_p(interval: Callable[[float], tuple[float, float, float]], null: float = 0.0) -> float:
    """The smallest alpha whose (1 - alpha) interval (``interval(level)`` -> (d, lo, hi)) excludes
    ``null``; 1 when even the 0.1% interval contains it. Bisection over alpha (the intervals nest)."""
    def excludes(alpha: float) -> bool:
        _, lo, hi = interval(1 - alpha)
        return not lo <= null <= hi

    if not excludes(0.999):
        return 1.0
    a, b = 1e-8, 0.999
    if excludes(a):
        return a
    for _ in range(40):
        m = math.sqrt(a * b)
        a, b = (a, m) if excludes(m) else (m, b)
    return b


def recovery_slope(recovery: pd.DataFrame, level: float = 0.95) -> tuple[float, float, float, float, int]:
    """(slope, lo, hi, stderr, df): least-squares slope of log mean TV error against log chains, over
    all (chains, seed) points, with a t interval."""
    r = stats.linregress(np.log(recovery.chains), np.log(recovery.mean_tv))
    df = len(recovery) - 2
    h = stats.t.ppf(0.5 + level / 2, df) * r.stderr
    return float(r.slope), float(r.slope - h), float(r.slope + h), float(r.stderr), df


def _unresolved(side: int, value: float) -> str:
    """The one label for an unresolved claim (``ctrls.report.verdicts.NOT_SUPPORTED``) with the estimate's
    direction: ``side`` is +1 when the estimate lies on the claimed side, -1 on the other, 0 at 0."""
    way = "in the claimed direction" if side > 0 else "in the opposite direction" if side < 0 else "zero"
    return f"not supported: the estimate is {way} ({value:+g})".replace("-", "−")


def _verdict(lo: float, hi: float, side: int) -> str:
    """'supported' when the interval lies on the claimed side of 0, 'contradicted' when on the other,
    else 'not supported' (the interval includes 0)."""
    if side * lo > 0 and side * hi > 0:
        return "supported"
    if side * lo < 0 and side * hi < 0:
        return "contradicted"
    return "not supported"


def claims(summary: pd.DataFrame, recovery: pd.DataFrame, cfg: Config) -> pd.DataFrame:
    """The paper's claims about exploration in RL (App. C.1, Sec. 6.3), and our check of the transition
    fit, each measured on the study with a per-claim 95% interval over seeds that respects the
    quantity's range, a p-value, its Holm adjustment over the table, the family interval at level
    1 - 0.05/m over the table's m claims ("family CI", Bonferroni: the Holm verdict's footing), and
    the verdict drawn from both (book/method.md)."""
    def runs(eps: float, alpha: float) -> pd.DataFrame:
        return summary[np.isclose(summary.epsilon, eps) & np.isclose(summary.alpha, alpha)]

    def seeds(s: pd.DataFrame) -> str:
        return f"{int(s.found.sum())}/{len(s)} seeds on the correct chain, {int(s.on_easy.sum())}/{len(s)} on the easy path"

    eps, alpha = cfg.rl.epsilon, cfg.rl.entropy_coef
    log_k = math.log(cfg.synthetic.n_states)
    unit, ent_range = (0.0, 1.0), (0.0, log_k)
    none, ent, epsr, both = runs(0, 0), runs(0, alpha), runs(eps, 0), runs(eps, alpha)
    rows = []

    def add(claim, source, measure, a, b, bounds, side, evidence, extra_p=None):
        d, lo, hi = welch_interval(a, b, bounds=bounds)
        p = interval_p(lambda lv: welch_interval(a, b, lv, bounds))
        if extra_p is not None:
            p = max(p, extra_p)  # intersection-union: every part must hold
        rows.append({"claim": claim, "paper": source, "measure": measure,
                     "claimed": f"{'↑' if side > 0 else '↓'} {measure} (n = {len(a)} vs {len(b)} seeds)", "value": round(d, 3),
                     "95% CI": f"[{lo:.3f}, {hi:.3f}]", "p": p, "_side": side * (1 if d > 0 else -1 if d < 0 else 0),
                     "evidence": evidence, "_family": lambda level: welch_interval(a, b, level, bounds)})

    tau = COLLAPSE_FRACTION * log_k
    collapsed = none.start_entropy_final.mean() < tau
    p_tau = interval_p(lambda lv: welch_interval(none.start_entropy_final, bounds=ent_range, level=lv), tau)
    _, nlo, nhi = welch_interval(none.start_entropy_final, bounds=ent_range)
    add("without entropy regularisation the policy collapses onto a few transitions", "App. C.1",
        f"entropy − none: start-state entropy after RL (nats); collapse: below {COLLAPSE_FRACTION:g} log K = {tau:.3f}",
        ent.start_entropy_final, none.start_entropy_final, ent_range, +1,
        f"none: {none.start_entropy_final.mean():.3f} nats after RL (95% CI [{nlo:.3f}, {nhi:.3f}]; "
        f"{'below' if collapsed else 'not below'} the threshold), entropy runs: {ent.start_entropy_final.mean():.3f}; "
        f"{seeds(none)}", extra_p=p_tau if collapsed else 1.0)
    add(f"entropy regularisation (α = {alpha:g}) prevents premature convergence onto high-probability, "
        "sub-optimal transitions", "Sec. 6.3, App. C.1",
        "entropy − none: final fraction of held-out chains on the easy path", ent.easy_final, none.easy_final, unit, -1,
        f"entropy: {seeds(ent)}; none: {seeds(none)}; start-state entropy after RL "
        f"{ent.start_entropy_final.mean():.3f} vs {none.start_entropy_final.mean():.3f} nats")
    a_max = max(cfg.synthetic.alphas)
    if a_max > alpha and not runs(0, a_max).empty:
        big = runs(0, a_max)
        add(f"a larger entropy weight (α = {a_max:g}, our sweep) prevents it", "(sweep)",
            f"α={a_max:g} − none (ε = 0): final fraction of held-out chains on the easy path",
            big.easy_final, none.easy_final, unit, -1,
            f"α={a_max:g}: {seeds(big)}; start-state entropy after RL {big.start_entropy_final.mean():.3f} nats")
    add(f"ε-greedy sampling (ε = {eps:g}) improves RL over no exploration", "App. C.1, Table 2",
        "epsilon − none: final held-out reward", epsr.reward_final, none.reward_final, unit, +1, f"epsilon: {seeds(epsr)}")
    others = {n: s for n, s in (("none", none), ("epsilon", epsr), ("entropy", ent))}
    best = max(others, key=lambda n: others[n].reward_mean.mean())
    add("both together give the fastest and most stable gains", "App. C.1",
        f"both − best other ({best}): mean held-out reward over training", both.reward_mean, others[best].reward_mean,
        unit, +1, f"both: {seeds(both)}; final reward range {both.reward_final.max() - both.reward_final.min():.3f} "
        f"(best other: {others[best].reward_final.max() - others[best].reward_final.min():.3f})")
    lo_e, hi_e = min(e for e in cfg.synthetic.epsilons if e > 0), max(cfg.synthetic.epsilons)
    if hi_e > lo_e:
        add(f"a mild ε ({lo_e:g}) beats a larger one ({hi_e:g})", "Sec. 6.3 (Llama)",
            f"ε={lo_e:g} − ε={hi_e:g} (α = 0): final held-out reward", runs(lo_e, 0).reward_final,
            runs(hi_e, 0).reward_final, unit, +1, f"ε={lo_e:g}: {seeds(runs(lo_e, 0))}; ε={hi_e:g}: {seeds(runs(hi_e, 0))}")
    e_max = max(cfg.synthetic.epsilons)
    if (e_max, a_max) != (eps, alpha) and not runs(e_max, a_max).empty:
        strong = runs(e_max, a_max)
        add(f"ε-greedy and the entropy bonus together prevent it (the sweep's largest ε = {e_max:g} and α = {a_max:g})",
            "(sweep)", f"ε={e_max:g},α={a_max:g} − none: final fraction of held-out chains on the easy path",
            strong.easy_final, none.easy_final, unit, -1,
            f"ε={e_max:g},α={a_max:g}: {seeds(strong)}; final held-out reward {strong.reward_final.mean():.3f}")
    s, lo, hi, se, df = recovery_slope(recovery)
    # inside the margin: TOST, p = the larger one-sided p-value (supported when small); outside: the
    # one-sided p-value that the slope lies beyond the nearer margin (contradicted when small)
    inside = abs(s - RATE) < RATE_MARGIN
    if se <= 0:
        p_rate = 0.0
    elif inside:
        p_rate = max(stats.t.sf((s - (RATE - RATE_MARGIN)) / se, df), stats.t.cdf((s - (RATE + RATE_MARGIN)) / se, df))
    else:
        p_rate = stats.t.sf((s - (RATE + RATE_MARGIN)) / se, df) if s > RATE else stats.t.cdf((s - (RATE - RATE_MARGIN)) / se, df)
    big_n = recovery[recovery.chains == recovery.chains.max()]
    rows.append({"claim": f"the transition fit's error falls at the parametric rate n^{RATE:g} (our check of Alg. 1's fit)",
                 "paper": "— (no recovery claim: Sec. 5.3 / Thm. 5.3 define the bound; Alg. 1 fits P_θ \"via KL\")",
                 "measure": f"slope of log mean TV error vs log chains; supported if within ±{RATE_MARGIN:g} of {RATE:g} (TOST)",
                 "claimed": f"slope = {RATE:g} ± {RATE_MARGIN:g}".replace("-", "−"),
                 "value": round(s, 3), "95% CI": f"[{lo:.3f}, {hi:.3f}]", "p": float(p_rate),
                 "_side": 1 if inside else -1, "_family": None,
                 "evidence": f"mean TV error {recovery[recovery.chains == recovery.chains.min()].mean_tv.mean():.3f} at "
                             f"{recovery.chains.min()} chains, {big_n.mean_tv.mean():.3f} at {recovery.chains.max()}"})
    t = pd.DataFrame(rows)
    t["p (Holm)"] = holm(t.p)  # the family: every claim of this table
    # the interval on the Holm verdict's footing: 1 - 0.05/m over the m claims (Bonferroni); the
    # recovery row tests a margin (TOST), its interval is the slope's at that level
    level = 1 - ALPHA / len(t)
    fam, verdicts = [], []
    for f, side, value, ph in zip(t["_family"], t["_side"], t["value"], t["p (Holm)"]):
        lo_f, hi_f = f(level)[1:] if f is not None else recovery_slope(recovery, level)[1:3]
        fam.append(f"[{lo_f:.3f}, {hi_f:.3f}]")
        if ph < ALPHA and f is not None and lo_f <= 0 <= hi_f:
            # Holm rejects, its family interval does not exclude 0: not resolved, and said so
            verdicts.append(_unresolved(side, value) + "; the Holm-adjusted test rejects but the family "
                            "interval includes 0")
        elif ph < ALPHA:
            verdicts.append("supported" if side > 0 else "contradicted")
        else:
            verdicts.append(_unresolved(side, value))
    t["family CI"] = fam
    t["verdict"] = verdicts
    return t.drop(columns=["_side", "_family"])


def claims_text(c: pd.DataFrame, n_seeds: int) -> str:
    """A Markdown paragraph per verdict, written from the claims table."""
    parts = [f"Verdicts are drawn from Holm-adjusted p-values over the {len(c)} claims below, at 0.05; the "
             f"intervals are per-claim 95% intervals over {n_seeds} seeds that stay inside each quantity's range."]
    for verdict, head in (("supported", "The study supports"), ("contradicted", "The study contradicts"),
                          ("not supported", f"The study does not support (at {n_seeds} seeds, Holm-adjusted p ≥ 0.05)")):
        rows = c[c.verdict.str.startswith(verdict)] if verdict == "not supported" else c[c.verdict == verdict]
        if len(rows):
            items = "; ".join(f"*{r.claim}* ({r.measure}: {r.value:g}, 95% CI {r['95% CI']})" for _, r in rows.iterrows())
            parts.append(f"**{head}:** {items}.")
    return "\n\n".join(parts)
