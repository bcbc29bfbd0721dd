"""The tables' metrics (Sec. 6.2, Tables 1 and 2): pass@k, Succ., their intervals, paired comparisons.

Inputs are boolean matrices (questions, samples); values are fractions in [0, 1]. ``pass_at_k_paper`` is
the paper's pass@20 (any correct among 20); :func:`pass_at_k` averages Chen et al.'s unbiased estimator.
Rates get intervals that hold at 0% and 100%: :func:`rate_interval` is Wilson's at a question-clustered
effective size (n_eff = Q near the ends); :func:`paired_rate_difference` is Newcombe's paired interval
(method 10, continuity-corrected phi, :func:`newcombe_paired`) with an exact McNemar or within-question
permutation p (never 0; :func:`format_p`); :func:`holm` adjusts a family. The bootstrap helpers
(:func:`bootstrap_ci`, ...) remain for means that are not rates. Degenerate input is an error, never a
number. The formulas and their reasons: book/method.md, "ctrls/stats/metrics.py".
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy.stats import binom

from ctrls.stats.power import wilson_interval

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

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the large binomials. n, c and
    k are counts: a non-integer value is an error.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer, float, np.floating)) \
                or not float(v).is_integer():
            raise ValueError(f"pass@k needs integer counts, got {name}={v!r}")
    n, c, k = int(n), int(c), int(k)
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
    """(mean, lo, hi): the mean of per-question values with a percentile bootstrap interval.

    One value has no interval (resampling it gives the value itself, a zero-width interval that
    would read as certainty): (mean, NaN, NaN) is returned, and callers print "n = 1, no interval"
    where they see NaN bounds."""
    v = np.asarray(per_question_values, dtype=float)
    if v.ndim != 1 or len(v) == 0 or not np.isfinite(v).all():
        raise ValueError(f"bootstrap_ci needs a non-empty 1-D array of finite values, got shape {v.shape}")
    if len(v) == 1:
        _interval(v, alpha)  # still refuses a bad alpha
        return float(v[0]), math.nan, math.nan
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


# ---- rates: Wilson intervals, Newcombe's paired difference, Holm, p-values (book/method.md) ----


def _counts(m, n, name: str) -> tuple[np.ndarray, np.ndarray]:
    m, n = np.asarray(m, dtype=float), np.asarray(n, dtype=float)
    if m.ndim != 1 or m.shape != n.shape or len(m) == 0:
        raise ValueError(f"{name}: successes and trials must be non-empty 1-D arrays of one length, "
                         f"got shapes {m.shape} and {n.shape}")
    if not (np.isfinite(m).all() and np.isfinite(n).all()) or (n <= 0).any() or (m < 0).any() or (m > n).any():
        raise ValueError(f"{name}: need 0 <= successes <= trials and trials > 0 for every question")
    return m, n


def _effective(m: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, residuals e_q / N, n_eff) of the rate sum m / sum n (book/method.md). ``m`` may carry
    leading axes (several tables on the same questions, for simulations); ``n`` is per question."""
    m = np.asarray(m, dtype=float)
    n = np.broadcast_to(np.asarray(n, dtype=float), m.shape)
    N, Q = n.sum(-1), m.shape[-1]
    M = m.sum(-1)
    p = M / N
    e = (m - p[..., None] * n) / N[..., None]
    ss = (e ** 2).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        small = (Q - 1) / Q * N / (N - 1) if Q > 1 else np.zeros_like(N)  # Q/(Q-1) over N/(N-1)
        clustered = np.where(ss > 0, p * (1 - p) / ss * small, N)  # no spread between questions: N
    clustered = np.clip(clustered, 1.0, N)
    # near 0% and 100% the clustered variance rests on the few minority outcomes: n_eff = Q there
    k, k0 = np.minimum(M, N - M), 2 * n.max(-1)  # minority count; below k0: Q
    w = np.clip((k - k0) / k0, 0.0, 1.0)  # 0 below 2 n_max, 1 from 4 n_max: no jump
    n_eff = np.where((p <= 0) | (p >= 1), float(Q), Q + (clustered - Q) * w)
    return p, e, np.clip(n_eff, 1.0, N)


def rate_intervals(m, n, alpha: float = 0.05) -> dict[str, np.ndarray]:
    """:func:`rate_interval` of many tables at once: row i of ``m`` (tables x questions) holds one
    table's successes per question, ``n`` the trials per question (shared). Arrays of rate, lo, hi,
    n_eff, one per row (a simulation's interval in one call)."""
    m, n = np.asarray(m, dtype=float), np.asarray(n, dtype=float)
    if m.ndim != 2 or len(m) == 0:
        raise ValueError(f"rate_intervals needs a non-empty (tables, questions) matrix, got shape {m.shape}")
    for row in m:
        _counts(row, n, "rate_intervals")
    p, _, n_eff = _effective(m, n)
    lo, hi = wilson_interval(p * n_eff, n_eff, alpha)
    return {"rate": p, "lo": np.maximum(0.0, lo), "hi": np.minimum(1.0, hi), "n_eff": n_eff}


def rate_interval(m, n, alpha: float = 0.05) -> dict[str, float]:
    """{rate, lo, hi, n_eff}: the rate sum_q m_q / sum_q n_q with a Wilson score interval at the
    effective sample size (book/method.md). ``m``, ``n``: successes and trials per question."""
    m, n = _counts(m, n, "rate_interval")
    r = rate_intervals(m[None, :], n, alpha)
    return {k: float(v[0]) for k, v in r.items()}


def mcnemar_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes: 2 P(X <= min(n_ab, n_ba)),
    X ~ Bin(n_ab + n_ba, 1/2), capped at 1 (1 when no pair is discordant)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"mcnemar_exact needs two 1-D arrays of paired outcomes of one length, got shapes "
                         f"{a.shape} and {b.shape}")
    a, b = a.astype(bool), b.astype(bool)
    n10, n01 = int((a & ~b).sum()), int((~a & b).sum())
    if n10 + n01 == 0:
        return 1.0
    return float(min(1.0, 2 * binom.cdf(min(n10, n01), n10 + n01, 0.5)))


def _phi_star(s_ab, s_aa, s_bb):
    """Newcombe's continuity-corrected phi from the cross- and self-products of the residuals in
    count units (book/method.md): (S_ab - 1/2) / sqrt(S_aa S_bb) above 1/2, 0 on [0, 1/2], the raw
    value below 0, and 0 where a rate has no variance."""
    s_ab, den = np.asarray(s_ab, dtype=float), np.sqrt(np.asarray(s_aa, dtype=float) * np.asarray(s_bb, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(s_ab > 0.5, (s_ab - 0.5) / den, np.where(s_ab >= 0, 0.0, s_ab / den))
    return np.where(den > 0, np.clip(r, -1.0, 1.0), 0.0)


def _mover(pa, la, ua, pb, lb, ub, r):
    """Newcombe's (MOVER) interval of pa - pb from the two Wilson intervals and their correlation r."""
    d = pa - pb
    lo = d - np.sqrt(np.maximum(0.0, (pa - la) ** 2 - 2 * r * (pa - la) * (ub - pb) + (ub - pb) ** 2))  # Newcombe (1998) 10
    hi = d + np.sqrt(np.maximum(0.0, (ua - pa) ** 2 - 2 * r * (ua - pa) * (pb - lb) + (pb - lb) ** 2))
    return d, np.maximum(-1.0, lo), np.minimum(1.0, hi)


def newcombe_paired(both, a_only, b_only, neither, alpha: float = 0.05):
    """(d, lo, hi, phi*): rate(a) - rate(b) = (a_only - b_only) / N for a paired 2x2 table (A both,
    B a only, C b only, D neither), Newcombe's method 10 with the continuity-corrected phi (module
    docstring). Elementwise on arrays of tables (then arrays)."""
    A, B, C, D = (np.asarray(x, dtype=float) for x in (both, a_only, b_only, neither))
    if any(np.isnan(x).any() or (x < 0).any() for x in (A, B, C, D)):
        raise ValueError("newcombe_paired needs non-negative counts in every cell of the 2x2 table")
    N = A + B + C + D
    if (N <= 0).any():
        raise ValueError("newcombe_paired: a table with no pairs has no difference")
    pa, pb = (A + B) / N, (A + C) / N
    la, ua = wilson_interval(A + B, N, alpha)
    lb, ub = wilson_interval(A + C, N, alpha)
    r = _phi_star((A * D - B * C) / N, (A + B) * (C + D) / N, (A + C) * (B + D) / N)
    d, lo, hi = _mover(pa, la, ua, pb, lb, ub, r)
    if np.ndim(d) == 0:
        return float(d), float(lo), float(hi), float(r)
    return d, lo, hi, r


def paired_rate_difference(ma, na, mb, nb, alpha: float = 0.05, n_perm: int = 2000,
                           seed: int = 0) -> dict[str, float]:
    """{diff, lo, hi, p_value, r}: rate(a) - rate(b) on the same questions (row q of each array is
    question q), Newcombe's paired interval with the continuity-corrected phi (``r``) and its
    p-value (book/method.md). For one binary outcome per question it equals
    :func:`newcombe_paired` of the 2x2 table."""
    ma, na = _counts(ma, na, "paired_rate_difference (a)")
    mb, nb = _counts(mb, nb, "paired_rate_difference (b)")
    if len(ma) != len(mb):
        raise ValueError(f"paired comparison needs the same questions: {len(ma)} vs {len(mb)}")
    pa, ea, na_eff = _effective(ma, na)
    pb, eb, nb_eff = _effective(mb, nb)
    la, ua = wilson_interval(pa * na_eff, na_eff, alpha)
    lb, ub = wilson_interval(pb * nb_eff, nb_eff, alpha)
    ra, rb = ea * na.sum(), eb * nb.sum()  # residuals m_q - p n_q, in counts
    r = float(_phi_star((ra * rb).sum(), (ra ** 2).sum(), (rb ** 2).sum()))
    d, lo, hi = _mover(pa, la, ua, pb, lb, ub, r)
    binary = bool((na == 1).all() and (nb == 1).all())
    p = mcnemar_exact(ma > 0, mb > 0) if binary else _swap_test(ma, na, mb, nb, n_perm, seed)
    return {"diff": float(d), "lo": float(lo), "hi": float(hi), "p_value": p, "r": r}


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


def interval(lo: float, hi: float, digits: int = 2) -> str:
    """``[lo, hi]`` to ``digits`` decimals, or "—" when a bound is missing (e.g. one question)."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "—"
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"
