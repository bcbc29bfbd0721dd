"""The tables' metrics (Sec. 6.2): pass@k, Succ., and bootstrap confidence intervals over questions.

Inputs are boolean matrices of shape (questions, samples). The paper's pass@20 is "at least one
correct among the 20 samples"; ``pass_at_k`` is the unbiased estimator of Chen et al. (2021),
which equals the paper's definition when k = n. Succ. is the fraction of samples with a valid
final answer. Values are fractions in [0, 1]; the book shows them x100.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

Metric = Callable[[np.ndarray], float]


def pass_at_k_paper(correct: np.ndarray) -> float:
    """Fraction of questions with at least one correct sample (the paper's pass@n)."""
    c = np.asarray(correct, dtype=bool)
    return float(c.any(axis=1).mean())


def pass_at_k_unbiased(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), in the numerically stable product form (Chen et al. 2021)."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k(correct: np.ndarray, k: int) -> float:
    """Mean over questions of the unbiased pass@k estimate."""
    c = np.asarray(correct, dtype=bool)
    n = c.shape[1]
    return float(np.mean([pass_at_k_unbiased(n, int(row.sum()), k) for row in c]))


def success_rate(valid: np.ndarray) -> float:
    """Succ.: the fraction of samples with a valid final answer."""
    return float(np.asarray(valid, dtype=bool).mean())


def _resample_rows(n: int, n_boot: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_ci(values: np.ndarray, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap of the mean of per-question values."""
    v = np.asarray(values, dtype=float)
    means = v[_resample_rows(len(v), n_boot, seed)].mean(axis=1)
    return float(v.mean()), float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))


def metric_with_ci(matrix: np.ndarray, metric: Metric, n_boot: int = 2000, alpha: float = 0.05,
                   seed: int = 0) -> tuple[float, float, float]:
    """(value, lo, hi) of ``metric`` on a (questions x samples) matrix, resampling questions."""
    m = np.asarray(matrix)
    boots = [metric(m[idx]) for idx in _resample_rows(len(m), n_boot, seed)]
    return float(metric(m)), float(np.quantile(boots, alpha / 2)), float(np.quantile(boots, 1 - alpha / 2))


def paired_bootstrap(a: np.ndarray, b: np.ndarray, metric: Metric, n_boot: int = 2000, alpha: float = 0.05,
                     seed: int = 0) -> dict[str, float]:
    """metric(a) - metric(b) on the same questions, with a paired bootstrap CI and p-value."""
    a, b = np.asarray(a), np.asarray(b)
    if len(a) != len(b):
        raise ValueError(f"paired comparison needs the same questions: {len(a)} vs {len(b)} rows")
    diffs = np.array([metric(a[i]) - metric(b[i]) for i in _resample_rows(len(a), n_boot, seed)])
    d = metric(a) - metric(b)
    # two-sided: how often the resampled difference falls on the other side of zero
    p = min(1.0, 2 * min((diffs <= 0).mean(), (diffs >= 0).mean()))
    return {"diff": float(d), "lo": float(np.quantile(diffs, alpha / 2)), "hi": float(np.quantile(diffs, 1 - alpha / 2)),
            "p_value": float(p)}
