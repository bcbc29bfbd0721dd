"""The tables' metrics (Sec. 6.2, Tables 1 and 2): pass@k, Succ., their intervals, paired comparisons.

Inputs are boolean matrices of shape (questions, samples). The paper's pass@20 is "at least one
correct among the 20 samples" (:func:`pass_at_k_paper`); :func:`pass_at_k` averages the unbiased
estimator of Chen et al. (2021), which equals the paper's definition when k = n. Succ. is the
fraction of samples with a valid final answer. Values are fractions in [0, 1]; the book shows them x100.

Intervals for rates (what the tables report), sound at 0% and 100%, where a percentile bootstrap
collapses to a point ("100.0 [100.0, 100.0]" at 40/40):

- :func:`rate_interval`: a rate sum_q m_q / sum_q n_q over questions q (m_q successes of n_q trials:
  pass@n has n_q = 1, Succ. n_q = samples, a match rate n_q = steps) with the Wilson score interval
  (``ctrls.power.wilson_interval``) at the effective sample size n_eff = p(1 - p) N^2 / sum_q e_q^2,
  e_q = m_q - p n_q (Kish's design effect from the linearised, question-clustered variance of the
  ratio; the samples of one question are not independent). n_eff is clipped to [1, N]; it is the
  number of questions when n_q = 1 (plain Wilson), and about N for independent samples. At p = 0 or 1
  the variance is 0 and n_eff is undefined: the stated fallback is n_eff = the number of questions
  (every question's samples counted as one observation, the conservative end for equal n_q).
- :func:`paired_rate_difference`: rate(a) - rate(b) on the same questions, by Newcombe's method for
  paired proportions (Newcombe 1998, Stat. Med. 17:2635, method 10; the MOVER form of Zou & Donner
  2008): with Wilson intervals (l, u) of each rate and r the correlation of the two estimates,
      lo = d - sqrt((p_a - l_a)^2 - 2 r (p_a - l_a)(u_b - p_b) + (u_b - p_b)^2),
      hi = d + sqrt((u_a - p_a)^2 - 2 r (u_a - p_a)(p_b - l_b) + (p_b - l_b)^2).
  For one binary outcome per question r is the phi coefficient of the 2x2 table (Newcombe's case);
  for clustered rates it is the correlation of the per-question residuals. r = 0 where a rate has no
  variance (as Newcombe sets phi = 0). The interval stays in [-1, 1] and never collapses.
  Its p-value: McNemar's exact test (binary outcomes), else a within-question permutation test
  (each question's a and b outcomes swapped at random), p = (1 + #{|T*| >= |T|}) / (1 + B), so
  never 0. :func:`format_p` prints a p-value below 1e-4 as "<1e-4", never as 0.
- :func:`holm`: Holm's step-down adjustment of a family of p-values (Holm 1979); a page that draws
  verdicts from a family of comparisons draws them from the adjusted p-values.

The bootstrap helpers (:func:`bootstrap_ci`, :func:`metric_with_ci`, :func:`paired_bootstrap`)
remain for means that are not rates (rubric scores, diversity); over questions, percentile.
"""
from __future__ import annotations

from typing import Callable

import math

import numpy as np
from scipy.stats import binom

from ctrls.power import wilson_interval

Metric = Callable[[np.ndarray], float]


def _matrix(m: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(m)
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty (questions, samples) matrix, got shape {a.shape}")
    return a.astype(bool)


def pass_at_k_paper(correct: np.ndarray) -> float:
    """Fraction of questions with at least one correct sample among all n (the paper's pass@n)."""
    return float(_matrix(correct, "correct").any(axis=1).mean())


def pass_at_k_unbiased(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k) for n samples of which c are correct (Chen et al. 2021).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the large binomials.
    """
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n correct samples, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k(correct: np.ndarray, k: int) -> float:
    """Mean over questions of the unbiased pass@k estimate; k > n samples is a ValueError.

    Vectorised: with t_i = 1 - k/i, 1 - pass@k for c correct is the product of t_i over
    i = n-c+1..n, a suffix product shared by all questions.
    """
    m = _matrix(correct, "correct")
    n = m.shape[1]
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k} with n={n} samples per question")
    c = m.sum(axis=1)
    t = 1.0 - k / np.arange(1, n + 1)
    # fail[j] = prod_{i=j+1}^{n} t_i for j = 0..n (fail[n] = 1); only j = n - c >= k is used
    fail = np.append(np.cumprod(t[::-1])[::-1], 1.0)
    miss = n - c
    return float(np.where(miss < k, 1.0, 1.0 - fail[miss]).mean())  # pass@k (Table 1, Table 2), unbiased


def success_rate(valid: np.ndarray) -> float:
    """Succ.: the fraction of samples with a valid final answer."""
    return float(_matrix(valid, "valid").mean())


def _resample_rows(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) row indices drawn with replacement."""
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def _interval(boots: np.ndarray, alpha: float) -> tuple[float, float]:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return float(np.quantile(boots, alpha / 2)), float(np.quantile(boots, 1 - alpha / 2))


def bootstrap_ci(per_question_values: np.ndarray, n_boot: int = 2000, alpha: float = 0.05,
                 seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of per-question values with a percentile bootstrap interval."""
    v = np.asarray(per_question_values, dtype=float)
    if v.ndim != 1 or len(v) == 0 or not np.isfinite(v).all():
        raise ValueError(f"bootstrap_ci needs a non-empty 1-D array of finite values, got shape {v.shape}")
    means = v[_resample_rows(len(v), n_boot, seed)].mean(axis=1)
    return (float(v.mean()), *_interval(means, alpha))


def metric_with_ci(matrix: np.ndarray, metric: Metric, n_boot: int = 2000, alpha: float = 0.05,
                   seed: int = 0) -> tuple[float, float, float]:
    """(value, lo, hi) of ``metric`` on a (questions x samples) matrix, resampling questions."""
    m = np.asarray(matrix)
    _matrix(m, "matrix")
    boots = np.array([metric(m[idx]) for idx in _resample_rows(len(m), n_boot, seed)])
    return (float(metric(m)), *_interval(boots, alpha))


def paired_bootstrap(a_matrix: np.ndarray, b_matrix: np.ndarray, metric: Metric, n_boot: int = 2000,
                     alpha: float = 0.05, seed: int = 0) -> dict[str, float]:
    """metric(a) - metric(b) on the same questions (e.g. a CTRLS row vs Base), with a paired CI.

    Question indices are resampled jointly for both matrices. The two-sided p-value is twice the
    fraction of bootstrap differences on the other side of 0 from the observed one, capped at 1.
    """
    a, b = np.asarray(a_matrix), np.asarray(b_matrix)
    _matrix(a, "a_matrix")
    _matrix(b, "b_matrix")
    if len(a) != len(b):
        raise ValueError(f"paired comparison needs the same questions: {len(a)} vs {len(b)} rows")
    diff = metric(a) - metric(b)
    diffs = np.array([metric(a[i]) - metric(b[i]) for i in _resample_rows(len(a), n_boot, seed)])
    other_side = (diffs <= 0).mean() if diff > 0 else (diffs >= 0).mean() if diff < 0 else 1.0
    lo, hi = _interval(diffs, alpha)
    return {"diff": float(diff), "lo": lo, "hi": hi, "p_value": float(min(1.0, 2 * other_side))}


# ---- rates: Wilson intervals, Newcombe's paired difference, Holm, p-values (module docstring) ----


def _counts(m, n, name: str) -> tuple[np.ndarray, np.ndarray]:
    m, n = np.asarray(m, dtype=float), np.asarray(n, dtype=float)
    if m.ndim != 1 or m.shape != n.shape or len(m) == 0:
        raise ValueError(f"{name}: successes and trials must be non-empty 1-D arrays of one length, "
                         f"got shapes {m.shape} and {n.shape}")
    if not (np.isfinite(m).all() and np.isfinite(n).all()) or (n <= 0).any() or (m < 0).any() or (m > n).any():
        raise ValueError(f"{name}: need 0 <= successes <= trials and trials > 0 for every question")
    return m, n


def _effective(m: np.ndarray, n: np.ndarray) -> tuple[float, np.ndarray, float]:
    """(p, residuals e_q / N, n_eff) of the rate sum m / sum n (module docstring)."""
    N = n.sum()
    p = m.sum() / N
    e = (m - p * n) / N
    ss = float((e ** 2).sum())
    if p in (0.0, 1.0) or ss <= 0:
        return float(p), e, float(len(m))  # the stated fallback: one observation per question
    return float(p), e, float(min(max(p * (1 - p) / ss, 1.0), N))


def rate_interval(m, n, alpha: float = 0.05) -> dict[str, float]:
    """{rate, lo, hi, n_eff}: the rate sum_q m_q / sum_q n_q with a Wilson score interval at the
    effective sample size (module docstring). ``m``, ``n``: successes and trials per question."""
    m, n = _counts(m, n, "rate_interval")
    p, _, n_eff = _effective(m, n)
    lo, hi = wilson_interval(p * n_eff, n_eff, alpha)  # Wilson at n_eff: never a point, inside [0, 1]
    return {"rate": p, "lo": float(max(0.0, lo)), "hi": float(min(1.0, hi)), "n_eff": n_eff}


def mcnemar_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes: 2 P(X <= min(n_ab, n_ba)),
    X ~ Bin(n_ab + n_ba, 1/2), capped at 1 (1 when no pair is discordant)."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    n10, n01 = int((a & ~b).sum()), int((~a & b).sum())
    if n10 + n01 == 0:
        return 1.0
    return float(min(1.0, 2 * binom.cdf(min(n10, n01), n10 + n01, 0.5)))


def paired_rate_difference(ma, na, mb, nb, alpha: float = 0.05, n_perm: int = 2000,
                           seed: int = 0) -> dict[str, float]:
    """{diff, lo, hi, p_value, r}: rate(a) - rate(b) on the same questions (row q of each array is
    question q), Newcombe's paired interval and its p-value (module docstring)."""
    ma, na = _counts(ma, na, "paired_rate_difference (a)")
    mb, nb = _counts(mb, nb, "paired_rate_difference (b)")
    if len(ma) != len(mb):
        raise ValueError(f"paired comparison needs the same questions: {len(ma)} vs {len(mb)}")
    pa, ea, na_eff = _effective(ma, na)
    pb, eb, nb_eff = _effective(mb, nb)
    la, ua = wilson_interval(pa * na_eff, na_eff, alpha)
    lb, ub = wilson_interval(pb * nb_eff, nb_eff, alpha)
    den = math.sqrt(float((ea ** 2).sum() * (eb ** 2).sum()))
    r = float((ea * eb).sum()) / den if den > 0 else 0.0  # phi for binary outcomes; 0 where undefined
    d = pa - pb
    lo = d - math.sqrt(max(0.0, (pa - la) ** 2 - 2 * r * (pa - la) * (ub - pb) + (ub - pb) ** 2))  # Newcombe (1998) 10
    hi = d + math.sqrt(max(0.0, (ua - pa) ** 2 - 2 * r * (ua - pa) * (pb - lb) + (pb - lb) ** 2))
    binary = bool((na == 1).all() and (nb == 1).all())
    p = mcnemar_exact(ma > 0, mb > 0) if binary else _swap_test(ma, na, mb, nb, n_perm, seed)
    return {"diff": float(d), "lo": float(max(-1.0, lo)), "hi": float(min(1.0, hi)), "p_value": p, "r": r}


def _swap_test(ma, na, mb, nb, n_perm: int, seed: int) -> float:
    """Within-question permutation test of rate(a) = rate(b): each question's (m, n) of a and b are
    swapped with probability 1/2; p = (1 + #{|T*| >= |T|}) / (1 + n_perm), never 0."""
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    obs = abs(ma.sum() / na.sum() - mb.sum() / nb.sum())
    swap = np.random.default_rng(seed).random((n_perm, len(ma))) < 0.5
    ta = np.where(swap, mb, ma).sum(1) / np.where(swap, nb, na).sum(1)
    tb = np.where(swap, ma, mb).sum(1) / np.where(swap, na, nb).sum(1)
    return float((1 + (np.abs(ta - tb) >= obs - 1e-12).sum()) / (1 + n_perm))


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979), in the input order: the i-th smallest of m
    is multiplied by m - i + 1, made monotone, capped at 1. NaN entries are left out of the family
    and stay NaN. Reject at level alpha exactly where the adjusted p < alpha."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    if not ok.any():
        return out
    if ((p[ok] < 0) | (p[ok] > 1)).any():
        raise ValueError(f"p-values must lie in [0, 1], got {p[ok].tolist()}")
    q = p[ok]
    order = np.argsort(q, kind="stable")
    m = len(q)
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * q[order]))  # Holm (1979)
    res = np.empty(m)
    res[order] = adj
    out[ok] = res
    return out


def format_p(p: float, floor: float = 1e-4) -> str:
    """A p-value for a table: "<1e-4" below ``floor`` (never "0"), else 2 significant digits; "–" for NaN."""
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    if not 0 <= p <= 1:
        raise ValueError(f"a p-value must lie in [0, 1], got {p}")
    if p < floor:
        return "<" + f"{floor:.0e}".replace("e-0", "e-")  # "<1e-4"
    return f"{p:.2g}"
