"""The tables' metrics (Sec. 6.2, Tables 1 and 2): pass@k, Succ., and bootstrap CIs over questions.

Inputs are boolean matrices of shape (questions, samples). The paper's pass@20 is "at least one
correct among the 20 samples" (:func:`pass_at_k_paper`); :func:`pass_at_k` averages the unbiased
estimator of Chen et al. (2021), which equals the paper's definition when k = n. Succ. is the
fraction of samples with a valid final answer. Confidence intervals resample questions (rows),
since the samples of one question are not independent. Values are fractions in [0, 1]; the book
shows them x100.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

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
