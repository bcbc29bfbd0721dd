"""Sizes chosen by power, before the run: what differences the demo's sizes can detect, with the
test each page runs.

The demo's comparisons (CTRLS vs Base as in Table 1, vs the fixed-s0 ablation, after vs before RL,
controllability) are paired over questions whose samples are not independent. By Monte Carlo (question
rates from a Beta fitted to the pilot, :func:`icc_from_rates`; the other arm through a Gaussian copula
with :func:`between_arm_correlation` and a logit shift), this module gives the power of the page's own
test (exact McNemar or the within-question permutation test, Holm at the page's family size,
:func:`families`) to detect a difference, and the MDD at 80% power. RL's MDD ignores the seed-to-seed
variance of training (optimistic). The simulation and its approximations: book/method.md,
"ctrls/stats/sizing.py".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import expit, logit
from scipy.stats import beta as beta_dist
from scipy.stats import binom, norm, rankdata
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


def pass_k(stat: str) -> int | None:
    """k of a "pass@k" statistic (the unbiased estimator from m >= k samples); None for "mean" and "any"."""
    return int(stat[5:]) if stat.startswith("pass@") and stat[5:].isdigit() else None


def unbiased_pass_k(c: np.ndarray, m: int, k: int) -> np.ndarray:
    """The unbiased pass@k of a question with c correct of m samples: 1 - C(m - c, k) / C(m, k) (Chen et al.
    2021), computed as a product so that no binomial coefficient is formed."""
    c = np.asarray(c)
    out = np.ones(c.shape)
    for j in range(k):  # C(m - c, k) / C(m, k) = prod_j (m - c - j) / (m - j)
        out = out * np.clip(m - c - j, 0, None) / (m - j)
    return 1.0 - out


def _on_scale(p: np.ndarray, stat: str, m: int) -> np.ndarray:
    """A question's expected statistic from its per-sample rate p: p ("mean"), 1 - (1 - p)^m ("any"), or
    1 - (1 - p)^k ("pass@k": what the unbiased estimator from m samples estimates)."""
    k = pass_k(stat)
    return p if stat == "mean" else 1 - (1 - p) ** (m if k is None else k)


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


TESTS = ("t", "mcnemar", "permutation")


def _other_arm(rng, base_u: np.ndarray, a: float, b: float, rho: float, s: float) -> np.ndarray:
    """The other arm's per-question rates: a Gaussian copula with correlation ``rho`` to Base's
    (Base at quantile u, the other arm's question at quantile Phi(rho z + sqrt(1 - rho^2) e), z =
    Phi^-1(u)), with Base's Beta marginal, then shifted by ``s`` on the logit scale. rho = 1 is the
    deterministic shift of Base's own rates; rho < 1 lets a question easy for one arm be hard for the
    other, as two arms' measured rates do."""
    if rho >= 1:
        u = base_u
    else:
        z = norm.ppf(base_u)
        u = norm.cdf(rho * z + math.sqrt(1 - rho * rho) * rng.standard_normal(base_u.shape))
    c = beta_dist.ppf(np.clip(u, 1e-12, 1 - 1e-12), a, b)
    return expit(logit(np.clip(c, 1e-9, 1 - 1e-9)) + s)


def _mcnemar_p(x1: np.ndarray, x0: np.ndarray) -> np.ndarray:
    """Exact two-sided McNemar p per simulated run of (runs x questions) binary outcomes."""
    b, c = (x1 & ~x0).sum(1), (~x1 & x0).sum(1)
    n = b + c
    return np.where(n > 0, np.minimum(1.0, 2 * binom.cdf(np.minimum(b, c), np.maximum(n, 1), 0.5)), 1.0)


def _swap_p(d: np.ndarray, n_perm: int, rng) -> np.ndarray:
    """Within-question permutation p per simulated run (``ctrls.stats.metrics`` swap test): with equal
    samples per question, swapping a question's two arms flips the sign of its difference d_q;
    p = (1 + #{|sum of signed d| >= |sum d|}) / (1 + n_perm), one set of sign draws for all runs."""
    signs = np.where(rng.random((d.shape[1], n_perm)) < 0.5, -1.0, 1.0)
    obs = np.abs(d.sum(1))
    return (1 + (np.abs(d @ signs) >= obs[:, None] - 1e-9).sum(1)) / (1 + n_perm)


def simulated_power(p0: float, delta: float, n_q: int, m: int, icc: float, stat: str = "mean",
                    n_sim: int = 2000, alpha: float = ALPHA, seed: int = 0, test: str = "t",
                    rho: float = 1.0, family: int = 1, n_perm: int = 2000) -> float:
    """Power of the paired test to detect a rise of ``delta`` in the statistic (``stat`` "mean": a
    per-sample rate such as pass@1; "any": pass@m, on its own scale; "pass@k": the unbiased pass@k from
    the m samples, :func:`unbiased_pass_k`) from a base arm whose
    per-sample rate is ``p0``. NaN when the raised statistic would reach 1.

    ``test``: "t" (the paired t-test), or the pages' own tests: "mcnemar" (exact McNemar on "any
    correct", pass@n's) or "permutation" (the within-question swap test, Succ.'s and the rates').
    ``family``: Holm at the page's family size m, the other comparisons showing nothing: the
    comparison is rejected at Holm's first step, p < alpha / m (Bonferroni; Holm can only add the
    rare runs where a null comparison is rejected first). ``rho``: the between-arm correlation of the
    questions' rates (:func:`_other_arm`, :func:`between_arm_correlation`)."""
    k = pass_k(stat)
    if stat not in ("mean", "any") and not (k and k <= m):
        raise ValueError(f"stat must be 'mean', 'any' or 'pass@k' with 1 <= k <= m = {m} samples, got {stat!r}")
    if test not in TESTS:
        raise ValueError(f"test must be one of {TESTS}, got {test!r}")
    if test == "mcnemar" and stat != "any":
        raise ValueError("the exact McNemar test compares 'any correct' (stat='any')")
    if not (n_q >= 2 and m >= 1):
        raise ValueError(f"need n_q >= 2 questions and m >= 1 samples, got n_q={n_q}, m={m}")
    for name, v in (("p0", p0), ("delta", delta), ("icc", icc), ("alpha", alpha), ("rho", rho)):
        if not math.isfinite(v):
            raise ValueError(f"simulated_power: {name} is {v}, not a number")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if not -1 <= rho <= 1:
        raise ValueError(f"rho must lie in [-1, 1], got {rho}")
    if not (n_sim >= 1 and family >= 1):
        raise ValueError(f"n_sim must be at least 1 simulated run and family at least 1, got {n_sim}, {family}")
    rng = np.random.default_rng(seed)
    a, b = beta_params(p0, icc)
    ref = rng.beta(a, b, size=200_000)
    target = float(_on_scale(ref, stat, m).mean()) + delta
    if target >= 1:
        return math.nan
    s = _shift_for(ref, target, stat, m)
    level = alpha / family
    if test == "t" and rho >= 1:
        base = rng.beta(a, b, size=(n_sim, n_q))
        other = expit(logit(np.clip(base, 1e-9, 1 - 1e-9)) + s)
    else:
        u = rng.random((n_sim, n_q))
        base = beta_dist.ppf(np.clip(u, 1e-12, 1 - 1e-12), a, b)
        other = _other_arm(rng, u, a, b, rho, s)
    x0, x1 = rng.binomial(m, base), rng.binomial(m, other)
    if test == "mcnemar":
        return float((_mcnemar_p(x1 > 0, x0 > 0) < level).mean())
    if k:  # the per-question difference of the unbiased pass@k estimates
        d = unbiased_pass_k(x1, m, k) - unbiased_pass_k(x0, m, k)
    else:
        d = (x1 - x0) / m if stat == "mean" else (x1 > 0).astype(float) - (x0 > 0)
    if test == "permutation":
        return float((_swap_p(d, n_perm, rng) < level).mean())
    mean, sd = d.mean(1), d.std(1, ddof=1)
    crit = student_t.ppf(1 - level / 2, n_q - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        tstat = np.where(sd > 0, mean / (sd / math.sqrt(n_q)), 0.0)
    return float((np.abs(tstat) > crit).mean())


def between_arm_correlation(rates_a, rates_b) -> float:
    """The between-arm correlation of two arms' per-question rates on the same questions, on the
    copula's scale: the Pearson correlation of their normal scores (ranks, ties averaged), clipped to
    [0, 1]; 1 (the deterministic shift) when either arm has no spread."""
    ra, rb = np.asarray(rates_a, float), np.asarray(rates_b, float)
    if ra.shape != rb.shape or ra.ndim != 1 or len(ra) < 3:
        raise ValueError(f"need per-question rates of the same >= 3 questions, got shapes {ra.shape}, {rb.shape}")
    if np.isnan(ra).any() or np.isnan(rb).any():
        raise ValueError("between_arm_correlation: a per-question rate is NaN")
    if ra.std() == 0 or rb.std() == 0:
        return 1.0
    za, zb = (norm.ppf(rankdata(x) / (len(x) + 1)) for x in (ra, rb))
    return float(np.clip(np.corrcoef(za, zb)[0, 1], 0.0, 1.0))


def minimal_detectable(p0: float, n_q: int, m: int, icc: float, stat: str = "mean", power: float = POWER,
                       n_sim: int = 2000, seed: int = 0, **test) -> float:
    """The smallest rise delta of the statistic (on a 0.01 grid) detected with ``power`` by the test
    ``test`` names (:func:`simulated_power`'s test, rho, family, n_perm); NaN when none is below 1
    minus the base statistic."""
    base = base_statistic(p0, m, icc, stat, seed)
    lo, hi = 1, int(math.floor((1 - base) * 100 - 1e-9))
    pw = lambda d: simulated_power(p0, d / 100, n_q, m, icc, stat, n_sim, seed=seed, **test)  # noqa: E731
    if hi < lo or not pw(hi) >= power:
        return math.nan
    while lo < hi:  # power rises with delta: bisection on the grid
        mid = (lo + hi) // 2
        if pw(mid) >= power:
            hi = mid
        else:
            lo = mid + 1
    return lo / 100


@dataclass(frozen=True)
class Comparison:
    """One comparison the demo reports: the claim it serves (``key``), its name, questions, samples
    per question per arm, statistic, the base rate it starts from, the page's test, the size of the
    page's Holm family, and the intra-question correlation of its own statistic."""

    key: str
    name: str
    n_q: int
    m: int
    stat: str
    p0: float
    test: str = "t"
    family: int = 1
    icc: float | None = None


def families(cfg) -> dict[str, int]:
    """The size of each page's Holm family at the profile's grid (as ``ctrls.report.tables`` builds them):
    Table 1, every CTRLS row against Base (epsilons x temperatures x datasets, plus one transfer row
    per transfer dataset, per backbone); the ablation, every comparison (fixed s0 − Base and each
    epsilon − fixed s0) in both metrics; controllability, every CTRLS row; RL, every setting of every
    (backbone, dataset) pair."""
    g, nb = cfg.grid, len(cfg.grid.backbones)
    cells = len(g.datasets) * len(g.temperatures)
    rows = len(g.epsilons) + (1 if g.fixed_state else 0)
    return {"table1": max(1, nb * (cells * len(g.epsilons) + len(g.transfer_datasets))),
            "ablation": max(1, 2 * nb * cells * rows) if g.fixed_state else 1,
            "controllability": max(1, nb * cells * rows),
            "rl": max(1, nb * len(g.datasets) * len(cfg.rl.settings))}


def demo_comparisons(cfg, p0: float, succ0: float | None = None, steps_per_chain: float = 3.0,
                     chance: float | None = None, icc_succ: float | None = None,
                     reference: float | None = None) -> list[Comparison]:
    """The comparisons of the demo's pages at the profile's sizes, each with the page's own test and
    Holm family (:func:`families`), from the pilot's Base pass@1 ``p0`` and Succ. ``succ0`` (with
    its own intra-question correlation ``icc_succ``): pass@n vs Base (Table 1, exact McNemar), Succ.
    (the ablation's family, permutation test), the ablation's pass@n (exact McNemar) and, as a design
    not run, the same comparison from twice the samples (the unbiased pass@n, permutation), RL after vs
    before (permutation), controllability against its real reference (``reference``: the rate at
    which Base steps land in chains drawn for them; chance 1/K only where no reference is known)."""
    g, rl = cfg.grid, cfg.rl
    fam = families(cfg)
    ref = reference if reference is not None else (chance if chance is not None else 1 / cfg.states.n_states)
    succ0 = succ0 if succ0 is not None else p0
    return [Comparison("pass@n", f"CTRLS vs Base, pass@{g.n_samples} (Table 1)", cfg.data.n_test, g.n_samples,
                       "any", p0, "mcnemar", fam["table1"]),
            Comparison("succ", "CTRLS vs fixed s0, Succ. (ablation)", cfg.data.n_test, g.n_samples, "mean", succ0,
                       "permutation", fam["ablation"], icc_succ),
            Comparison("ablation", f"CTRLS vs fixed s0, pass@{g.n_samples} (ablation)", cfg.data.n_test, g.n_samples,
                       "any", p0, "mcnemar", fam["ablation"]),
            Comparison("ablation design", f"CTRLS vs fixed s0, unbiased pass@{g.n_samples} from {2 * g.n_samples} "
                       f"samples (a design, not run: twice the samples)", cfg.data.n_test, 2 * g.n_samples,
                       f"pass@{g.n_samples}", p0, "permutation", fam["ablation"]),
            Comparison("rl", "after vs before RL, held-out accuracy", rl.eval_questions,
                       rl.eval_samples * len(rl.seeds), "mean", p0, "permutation", fam["rl"]),
            Comparison("controllability", "step lands in its sampled state vs Base steps with drawn states "
                       "(controllability)", cfg.data.n_test, max(1, int(round(g.n_samples * steps_per_chain))),
                       "mean", ref, "permutation", fam["controllability"])]


_CACHE: dict = {}


def demo_power(cfg, p0: float, icc: float, target: float = 0.10, n_sim: int = 1000, seed: int = 0,
               rho: float = 1.0, **kw) -> pd.DataFrame:
    """For each demo comparison (:func:`demo_comparisons`): n, samples per question, the page's
    test and Holm family, the base rate of its statistic, the power at a ``target`` rise (default 10
    points) and the MDD at 80% power, in percentage points; "detects 10 pts" is power >= 0.8. A
    statistic whose base rate is p0 + 10 points or more past 100% has no power there (NaN). ``rho``:
    the between-arm correlation (:func:`between_arm_correlation`). The result is cached per
    arguments, so the summary page and the scorecard quote one number per claim."""
    key = (repr(cfg), p0, icc, target, n_sim, seed, rho, tuple(sorted(kw.items())))
    if key in _CACHE:
        return _CACHE[key].copy()
    rows = []
    for c in demo_comparisons(cfg, p0, **kw):
        ic = c.icc if c.icc is not None else icc
        test = {"test": c.test, "family": c.family, "rho": rho, "n_perm": 1000}
        pw = simulated_power(c.p0, target, c.n_q, c.m, ic, c.stat, n_sim, seed=seed, **test)
        mdd = minimal_detectable(c.p0, c.n_q, c.m, ic, c.stat, n_sim=n_sim, seed=seed, **test)
        rows.append({"key": c.key, "comparison": c.name, "questions": c.n_q, "samples per question": c.m,
                     "test": {"mcnemar": "exact McNemar", "permutation": "permutation"}.get(c.test, c.test),
                     "Holm family": c.family, "icc": round(ic, 3),
                     "base rate (%)": 100 * base_statistic(c.p0, c.m, ic, c.stat, seed),
                     f"power at +{100 * target:g} pts": pw,
                     "MDD at 80% power (pts)": 100 * mdd, f"detects {100 * target:g} pts": bool(pw >= POWER)})
    out = pd.DataFrame(rows)
    _CACHE[key] = out
    return out.copy()
