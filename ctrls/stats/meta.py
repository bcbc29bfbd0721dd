"""Pooling over training runs: a random-effects meta-analysis of one estimate per run.

Each fresh training seed gives an estimate y_i with its within-run variance v_i (the question-level sampling
variance of a paired difference, or of kappa). Runs differ by more than their questions' noise (the between-run
variance tau^2), so the pooled mean is the random-effects one (DerSimonian & Laird 1986: tau^2 by the method of
moments from Cochran's Q), its 95% interval the Hartung-Knapp-Sidik-Jonkman one (a t interval with k - 1
degrees of freedom on the weighted residual scale, which keeps its coverage with few runs where the normal
interval does not), and the 95% prediction interval for one new run
mu +- t_{k-2} sqrt(tau^2 + SE(mu)^2) (Higgins, Thompson & Spiegelhalter 2009): what a user's own run may give.
The formulas are written here: ``statsmodels.stats.meta_analysis.combine_effects`` (0.15) leaves DerSimonian-Laird's
tau^2 negative when Q < k - 1, which gives runs negative weights; the tests check these numbers against it where
tau^2 > 0.

``two_stage_bootstrap`` resamples seeds, then questions within each seed, as a check that assumes no normality;
``pooled_power`` simulates the pooled test as run, with the between-run spread in it.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats as st

ALPHA = 0.05


def random_effects(estimates: Sequence[float], variances: Sequence[float], alpha: float = ALPHA,
                   bounds: tuple[float, float] | None = None) -> dict:
    """The pooled random-effects estimate of one estimate per run (module docstring), with ``lo``/``hi`` the
    HKSJ interval, ``se`` its standard error, ``tau`` (sqrt of DerSimonian-Laird's tau^2), ``i2`` (the share of
    the spread that is between runs), Cochran's ``q`` and its p-value ``q_p``, and the prediction interval
    ``pred_lo``/``pred_hi`` (None with fewer than 3 runs: it has k - 2 degrees of freedom). With ``bounds`` (the
    quantity's range: [-1, 1] for a difference of rates) both intervals are cut to it, and ``clipped`` says so."""
    y, v = np.asarray(estimates, dtype=float), np.asarray(variances, dtype=float)
    if y.ndim != 1 or y.shape != v.shape or len(y) < 2:
        raise ValueError(f"random_effects needs one estimate and one variance per run, at least 2 runs; got {y.shape}, {v.shape}")
    if not (np.isfinite(y).all() and np.isfinite(v).all()) or (v < 0).any():
        raise ValueError("random_effects: every estimate and variance must be finite, every variance >= 0")
    k = len(y)
    if np.ptp(y) == 0:  # every run gave the same number: no spread to pool, the interval is the point
        x = float(y[0])
        return {"estimate": x, "lo": x, "hi": x, "se": 0.0, "tau": 0.0, "i2": 0.0, "q": 0.0, "q_p": 1.0, "n_seeds": k,
                "method": "every run equal", "pred_lo": x if k >= 3 else None, "pred_hi": x if k >= 3 else None}
    v = np.maximum(v, 1e-12)  # a run whose questions all agree has no within-run variance; its weight stays finite
    w = 1 / v
    mu_fe = float((w * y).sum() / w.sum())
    q, df = float((w * (y - mu_fe) ** 2).sum()), k - 1  # Cochran's Q
    tau2 = max(0.0, (q - df) / float(w.sum() - (w ** 2).sum() / w.sum()))  # DerSimonian-Laird, truncated at 0
    ws = 1 / (v + tau2)
    mu = float((ws * y).sum() / ws.sum())
    se = math.sqrt(float((ws * (y - mu) ** 2).sum()) / (df * float(ws.sum())))  # Hartung-Knapp(-Sidik-Jonkman)
    t1 = st.t.ppf(1 - alpha / 2, df)
    out = {"estimate": mu, "lo": mu - t1 * se, "hi": mu + t1 * se, "se": se, "tau": math.sqrt(tau2),
           "i2": max(0.0, (q - df) / q) if q > 0 else 0.0, "q": q, "q_p": float(st.chi2.sf(q, df)),
           "n_seeds": k, "method": "DerSimonian-Laird tau^2, Hartung-Knapp-Sidik-Jonkman interval",
           "pred_lo": None, "pred_hi": None}
    if k >= 3:
        se_re = math.sqrt(1 / float(ws.sum()))  # the usual random-effects SE of mu, as in Higgins et al.
        half = st.t.ppf(1 - alpha / 2, k - 2) * math.sqrt(tau2 + se_re ** 2)
        out["pred_lo"], out["pred_hi"] = mu - half, mu + half
    if bounds is not None:  # a normal interval can run past what the quantity can be; cut it there, and say so
        lo, hi = bounds
        ends = [k for k in ("lo", "hi", "pred_lo", "pred_hi") if out[k] is not None]
        out["clipped"] = any(not lo <= out[k] <= hi for k in ends)
        for k in ends:
            out[k] = min(max(out[k], lo), hi)
    return out


def paired_mean(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(mean of a - b, its sampling variance var(a - b) / n): one run's paired difference over its questions."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.ndim != 1 or len(d) < 2:
        raise ValueError(f"a paired difference needs at least 2 questions, got {d.shape}")
    return float(d.mean()), float(d.var(ddof=1) / len(d))


def two_stage_bootstrap(per_seed: Sequence[np.ndarray], n_boot: int = 4000, alpha: float = ALPHA, seed: int = 0,
                        stat: Callable[[np.ndarray], float] = np.mean) -> dict:
    """The unweighted mean over seeds of each seed's ``stat`` of its per-question values (``per_seed``: one
    array per seed, e.g. per-question paired differences), with a percentile interval from resampling seeds,
    then questions within each drawn seed."""
    arrs = [np.asarray(a, dtype=float) for a in per_seed]
    if len(arrs) < 2 or any(a.ndim != 1 or len(a) == 0 for a in arrs):
        raise ValueError("two_stage_bootstrap needs at least 2 seeds, each with at least one question")
    rng = np.random.default_rng(seed)
    k = len(arrs)
    boot = np.empty(n_boot)
    for b in range(n_boot):
        boot[b] = np.mean([stat(arrs[i][rng.integers(0, len(arrs[i]), len(arrs[i]))]) for i in rng.integers(0, k, k)])
    lo, hi = np.percentile(boot, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return {"estimate": float(np.mean([stat(a) for a in arrs])), "lo": float(lo), "hi": float(hi), "n_boot": n_boot}


def pooled_power(delta: float, tau: float, variances: Sequence[float], n_sims: int = 2000, alpha: float = ALPHA,
                 seed: int = 0, n_seeds: int | None = None) -> float:
    """The share of simulated studies whose pooled HKSJ interval excludes 0 on delta's side, when each run's
    true effect is drawn from N(delta, tau^2) and its estimate adds N(0, v_i) (``variances``: the runs'
    within-run variances, recycled to ``n_seeds`` runs)."""
    rng = np.random.default_rng(seed)
    v = np.asarray(variances, dtype=float)
    k = len(v) if n_seeds is None else int(n_seeds)
    v = np.resize(v, k)
    hits = 0
    for _ in range(n_sims):
        y = delta + tau * rng.standard_normal(k) + np.sqrt(v) * rng.standard_normal(k)
        r = random_effects(y, v, alpha)
        hits += (r["lo"] > 0) if delta >= 0 else (r["hi"] < 0)
    return hits / n_sims


__all__ = ["paired_mean", "pooled_power", "random_effects", "two_stage_bootstrap"]
