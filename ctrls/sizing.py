"""Sizes chosen by power, before the run: what differences the demo's sizes can detect.

The demo compares rates measured on the same test questions: CTRLS vs Base (pass@1, pass@n,
Succ.), CTRLS vs the fixed-s0 ablation, held-out accuracy after vs before RL, and the rate at which
a generated step lands in its sampled state vs the Base samples' rate (chance). Each is a paired
comparison over questions, with several samples per question that are *not* independent (a
question is easy or hard for every sample). This module answers, by Monte Carlo, the question
"with ``n_q`` questions x ``m`` samples per arm, what is the power to detect a difference of
``delta``, and what is the minimal detectable difference (MDD) at 80% power?":

- per-question base rates b_q ~ Beta with mean p0 and intra-question correlation ``icc``
  (a = p0 (1 - icc) / icc, b = (1 - p0)(1 - icc) / icc), the model fitted to the measured pilot
  (``bench/word_problems.py``: p0 and icc from its per-question rates, :func:`icc_from_rates`);
- the other arm's rates c_q = sigmoid(logit(b_q) + s), with the logit shift s chosen so that the
  statistic's mean rises by delta on its own scale (pass@1 or a rate: the mean rate; pass@m: the
  mean of 1 - (1 - c_q)^m), an effect that respects [0, 1];
- each arm draws ``m`` Bernoulli samples per question; the per-question statistic is the mean
  (pass@1, a step-match rate) or "any correct" (pass@m);
- the test: a two-sided paired t-test at alpha = 0.05 on the per-question differences (the
  large-sample counterpart of the paired intervals on the pages); the power is the fraction of
  ``n_sim`` simulated runs that reject, and the MDD is the smallest delta on a 1-point grid whose
  power reaches 0.8 (NaN when none does before the statistic reaches 1).

Stated approximations: RL's after-vs-before pools the seeds' evaluation samples (m = eval
samples x seeds) and ignores the seed-to-seed variance of training, so its MDD is optimistic; the
controllability comparison treats the steps of one question as its samples (m = samples x mean
steps per chain).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import expit, logit
from scipy.stats import t as student_t

ALPHA = 0.05
POWER = 0.8


def beta_params(p0: float, icc: float) -> tuple[float, float]:
    """Beta(a, b) with mean p0 and intra-class correlation icc = 1 / (a + b + 1)."""
    if not 0 < p0 < 1:
        raise ValueError(f"base rate p0 must be in (0, 1), got {p0}")
    if not 0 < icc < 1:
        raise ValueError(f"icc must be in (0, 1), got {icc}")
    k = (1 - icc) / icc
    return p0 * k, (1 - p0) * k


def icc_from_rates(rates: np.ndarray, m: int) -> float:
    """Intra-question correlation from per-question success rates of ``m`` samples each, clipped to
    [0.01, 0.99]. Moment estimator: with b_q the question's rate, Var(rate) = s_b^2 (1 - 1/m) +
    p (1 - p) / m, so s_b^2 = (Var(rate) - p (1 - p) / m) / (1 - 1/m), and icc = s_b^2 / (p (1 - p)).
    With m = 1 there is no within-question information: 0.5 is returned (a middle value)."""
    rates = np.asarray(rates, float)
    if rates.ndim != 1 or len(rates) < 2 or not m >= 1:
        raise ValueError(f"need per-question rates of at least 2 questions and m >= 1, got shape {rates.shape}, m={m}")
    if np.isnan(rates).any():
        raise ValueError(f"icc_from_rates: {int(np.isnan(rates).sum())} per-question rate(s) are NaN")
    if ((rates < 0) | (rates > 1)).any():
        bad = rates[(rates < 0) | (rates > 1)]
        raise ValueError(f"icc_from_rates: rates must lie in [0, 1] (fractions, not percentages), got {bad[:3].tolist()}")
    p = rates.mean()
    if p <= 0 or p >= 1 or m == 1:
        return 0.5  # no information about the spread: a middle value, stated where it is used
    var_b = (rates.var(ddof=1) - p * (1 - p) / m) / (1 - 1 / m)
    return float(np.clip(var_b / (p * (1 - p)), 0.01, 0.99))


def _on_scale(p: np.ndarray, stat: str, m: int) -> np.ndarray:
    """A question's expected statistic from its per-sample rate p: p ("mean") or 1 - (1 - p)^m ("any")."""
    return p if stat == "mean" else 1 - (1 - p) ** m


def _shift_for(b: np.ndarray, target: float, stat: str = "mean", m: int = 1) -> float:
    """The logit shift s with mean(stat(sigmoid(logit(b) + s))) = target (bisection)."""
    lb = logit(np.clip(b, 1e-9, 1 - 1e-9))
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _on_scale(expit(lb + mid), stat, m).mean() < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def base_statistic(p0: float, m: int, icc: float, stat: str, seed: int = 0) -> float:
    """The expected statistic of the base arm under the model: p0 ("mean") or E[1 - (1 - b_q)^m] ("any")."""
    return float(_on_scale(np.random.default_rng(seed).beta(*beta_params(p0, icc), 200_000), stat, m).mean())


def simulated_power(p0: float, delta: float, n_q: int, m: int, icc: float, stat: str = "mean",
                    n_sim: int = 2000, alpha: float = ALPHA, seed: int = 0) -> float:
    """Power of the paired test (module docstring) to detect a rise of ``delta`` in the statistic
    (``stat`` "mean": a per-sample rate such as pass@1; "any": pass@m, on its own scale) from a base
    arm whose per-sample rate is ``p0``. NaN when the raised statistic would reach 1."""
    if stat not in ("mean", "any"):
        raise ValueError(f"stat must be 'mean' or 'any', got {stat!r}")
    if not (n_q >= 2 and m >= 1):
        raise ValueError(f"need n_q >= 2 questions and m >= 1 samples, got n_q={n_q}, m={m}")
    for name, v in (("p0", p0), ("delta", delta), ("icc", icc), ("alpha", alpha)):
        if not math.isfinite(v):
            raise ValueError(f"simulated_power: {name} is {v}, not a number")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if not n_sim >= 1:
        raise ValueError(f"n_sim must be at least 1 simulated run, got {n_sim}")
    rng = np.random.default_rng(seed)
    a, b = beta_params(p0, icc)
    ref = rng.beta(a, b, size=200_000)
    target = float(_on_scale(ref, stat, m).mean()) + delta
    if target >= 1:
        return math.nan
    s = _shift_for(ref, target, stat, m)
    base = rng.beta(a, b, size=(n_sim, n_q))
    other = expit(logit(np.clip(base, 1e-9, 1 - 1e-9)) + s)
    x0, x1 = rng.binomial(m, base), rng.binomial(m, other)
    d = (x1 - x0) / m if stat == "mean" else (x1 > 0).astype(float) - (x0 > 0)
    mean, sd = d.mean(1), d.std(1, ddof=1)
    crit = student_t.ppf(1 - alpha / 2, n_q - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        tstat = np.where(sd > 0, mean / (sd / math.sqrt(n_q)), 0.0)
    return float((np.abs(tstat) > crit).mean())


def minimal_detectable(p0: float, n_q: int, m: int, icc: float, stat: str = "mean", power: float = POWER,
                       n_sim: int = 2000, seed: int = 0) -> float:
    """The smallest rise delta of the statistic (on a 0.01 grid) detected with ``power``; NaN when
    none is below 1 minus the base statistic."""
    base = base_statistic(p0, m, icc, stat, seed)
    lo, hi = 1, int(math.floor((1 - base) * 100 - 1e-9))
    if hi < lo or not simulated_power(p0, hi / 100, n_q, m, icc, stat, n_sim, seed=seed) >= power:
        return math.nan
    while lo < hi:  # power rises with delta: bisection on the grid
        mid = (lo + hi) // 2
        if simulated_power(p0, mid / 100, n_q, m, icc, stat, n_sim, seed=seed) >= power:
            hi = mid
        else:
            lo = mid + 1
    return lo / 100


@dataclass(frozen=True)
class Comparison:
    """One comparison the demo reports: its name, questions, samples per question per arm, statistic,
    and the base rate it starts from."""

    name: str
    n_q: int
    m: int
    stat: str
    p0: float


def demo_comparisons(cfg, p0: float, succ0: float | None = None, steps_per_chain: float = 3.0,
                     chance: float | None = None) -> list[Comparison]:
    """The comparisons of the demo's pages at the profile's sizes, from the pilot's Base pass@1 ``p0``
    and Succ. ``succ0``, in this order: pass@n and Succ. vs Base (Table 1), the ablation (pass@n),
    RL after vs before, controllability vs chance. Base pass@n is derived from p0 under the fitted
    model by :func:`demo_power`."""
    g, rl = cfg.grid, cfg.rl
    chance = chance if chance is not None else 1 / cfg.states.n_states
    succ0 = succ0 if succ0 is not None else p0
    return [Comparison(f"CTRLS vs Base, pass@{g.n_samples} (Table 1)", cfg.data.n_test, g.n_samples, "any", p0),
            Comparison("CTRLS vs Base, Succ. (Table 1)", cfg.data.n_test, g.n_samples, "mean", succ0),
            Comparison(f"CTRLS vs fixed s0, pass@{g.n_samples} (ablation)", cfg.data.n_test, g.n_samples, "any", p0),
            Comparison("after vs before RL, held-out accuracy", rl.eval_questions, rl.eval_samples * len(rl.seeds),
                       "mean", p0),
            Comparison("step lands in its sampled state vs chance (controllability)", cfg.data.n_test,
                       max(1, int(round(g.n_samples * steps_per_chain))), "mean", chance)]


def demo_power(cfg, p0: float, icc: float, target: float = 0.10, n_sim: int = 1000, seed: int = 0,
               **kw) -> pd.DataFrame:
    """For each demo comparison (:func:`demo_comparisons`): n, samples per question, the base rate
    of its statistic, the power at a ``target`` rise (default 10 points) and the MDD at 80% power,
    in percentage points; "detects 10 pts" is power >= 0.8. A statistic whose base rate is p0 + 10
    points or more past 100% has no power there (NaN)."""
    rows = []
    for c in demo_comparisons(cfg, p0, **kw):
        pw = simulated_power(c.p0, target, c.n_q, c.m, icc, c.stat, n_sim, seed=seed)
        mdd = minimal_detectable(c.p0, c.n_q, c.m, icc, c.stat, n_sim=n_sim, seed=seed)
        rows.append({"comparison": c.name, "questions": c.n_q, "samples per question": c.m,
                     "base rate (%)": 100 * base_statistic(c.p0, c.m, icc, c.stat, seed),
                     f"power at +{100 * target:g} pts": pw,
                     "MDD at 80% power (pts)": 100 * mdd, f"detects {100 * target:g} pts": bool(pw >= POWER)})
    return pd.DataFrame(rows)
