"""Intervals and tests for proportions: Wilson and Newcombe intervals, exact McNemar, and the
minimal detectable difference (MDD) on the arcsine scale (Cohen's h).

Newcombe's hybrid score interval (Newcombe 1998, method 10) for a difference of two independent
proportions, with Wilson intervals (l_i, u_i) of each rate:

    d = p_1 - p_0,  lo = d - sqrt((p_1 - l_1)^2 + (u_0 - p_0)^2),  hi = d + sqrt((u_1 - p_1)^2 + (p_0 - l_0)^2)

A two-sample z test with n per arm detects |h| >= h* = (z_{1-alpha/2} + z_{1-beta}) sqrt(2 / n), so
MDD up = sin^2(asin sqrt(p_0) + h*/2) - p_0 (the far rejection tail ignored). What the paper's own
tables can resolve with these is ``ctrls.report.paper_power``.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom, norm

ALPHA = 0.05  # two-sided
POWER = 0.8


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:  # NaN fails too
        raise ValueError(f"alpha must lie in (0, 1) (0.05 for a 95% interval), got {alpha}")


def wilson_interval(x, n, alpha: float = ALPHA):
    """Wilson score interval (lo, hi) for x successes in n trials (x and n may be fractional: an
    effective count). Elementwise on arrays of x and n, which then give arrays."""
    _check_alpha(alpha)
    xa, na = np.asarray(x, dtype=float), np.asarray(n, dtype=float)
    if np.isnan(xa).any() or np.isnan(na).any() or (na <= 0).any() or (xa < 0).any() or (xa > na).any():
        raise ValueError(f"need 0 <= x <= n and n > 0, got x={x}, n={n}")
    z = norm.ppf(1 - alpha / 2)
    p = xa / na
    centre = p + z * z / (2 * na)
    half = z * np.sqrt(p * (1 - p) / na + z * z / (4 * na * na))
    lo, hi = (centre - half) / (1 + z * z / na), (centre + half) / (1 + z * z / na)
    # exact at the ends (rounding leaves lo ~ 1e-17 at x = 0), and never excluding the estimate
    lo, hi = np.where(xa == 0, 0.0, np.minimum(lo, p)), np.where(xa == na, 1.0, np.maximum(hi, p))
    if lo.ndim == 0:
        return float(lo), float(hi)
    return lo, hi


def newcombe_interval(x1: int, n1: int, x0: int, n0: int, alpha: float = ALPHA) -> tuple[float, float, float]:
    """(d, lo, hi) for d = x1/n1 - x0/n0, Newcombe's hybrid score interval (method 10) for two
    independent proportions. Zero trials on either side is an error (no rate to compare)."""
    for x, n, side in ((x1, n1, "first"), (x0, n0, "second")):
        if not n > 0:
            raise ValueError(f"newcombe_interval: the {side} proportion has {n} trials; each needs at least one")
        if not 0 <= x <= n:
            raise ValueError(f"newcombe_interval: the {side} proportion needs 0 <= successes <= trials, got {x} of {n}")
    p1, p0 = x1 / n1, x0 / n0
    l1, u1 = wilson_interval(x1, n1, alpha)
    l0, u0 = wilson_interval(x0, n0, alpha)
    d = p1 - p0
    return d, d - math.sqrt((p1 - l1) ** 2 + (u0 - p0) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p0 - l0) ** 2)


def detectable_h(n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """h* = (z_{1-alpha/2} + z_{power}) sqrt(2 / n): the smallest Cohen's h a two-sided two-sample
    test with n per arm detects with the given power."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    return (norm.ppf(1 - alpha / 2) + norm.ppf(power)) * math.sqrt(2 / n)


def minimal_detectable_difference(p0: float, n: int, alpha: float = ALPHA, power: float = POWER) -> tuple[float, float]:
    """(MDD up, MDD down) from the base rate p0 at n per arm (module docstring); NaN where the
    detectable rate would leave [0, 1]."""
    if not 0 <= p0 <= 1:
        raise ValueError(f"base rate must be in [0, 1], got {p0}")
    phi, h = math.asin(math.sqrt(p0)), detectable_h(n, alpha, power)
    up = math.sin(phi + h / 2) ** 2 - p0 if phi + h / 2 <= math.pi / 2 else math.nan
    down = p0 - math.sin(phi - h / 2) ** 2 if phi - h / 2 >= 0 else math.nan
    return up, down


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value of b vs c discordant questions (binomial, 1/2): 2 P(X <= min)
    capped at 1; 1 without discordant questions."""
    if b + c == 0:
        return 1.0
    return float(min(1.0, 2 * binom.cdf(min(b, c), b + c, 0.5)))


def paired_p_range(x1: int, x0: int, n: int) -> tuple[float, float]:
    """(smallest, largest) exact McNemar p that two rows of x1 and x0 solved questions out of the same
    n could give, over every pairing of their questions consistent with the published rates: the
    smallest with minimal discordance (only the |x1 - x0| questions that make the difference are
    discordant, all one way), the largest with maximal discordance (b + c = min(x1 + x0, 2n - x1 - x0))."""
    if not (0 <= x1 <= n and 0 <= x0 <= n):
        raise ValueError(f"need 0 <= x1, x0 <= n, got x1={x1}, x0={x0}, n={n}")
    d = x1 - x0
    lo_p = mcnemar_p(max(d, 0), max(-d, 0))
    total = min(x1 + x0, 2 * n - x1 - x0)  # b + c at most; b - c = d, same parity as d
    b = (total + d) // 2
    return lo_p, mcnemar_p(b, b - d)


