"""Synthetic verdicts from the data: intervals over seeds are binomial for counts of
seeds, Welch where both sides vary, never the worst-case variance bound that made every interval
about +-0.4 whatever the seeds showed."""
import math

import numpy as np
import pytest

from ctrls.stats.power import wilson_interval
from ctrls.synthetic.claims import interval_p, welch_interval

UNIT = (0.0, 1.0)


@pytest.mark.parametrize("x1,n1,x0,n0,published", [(0, 10, 0, 10, (-0.2775, 0.2775)), (9, 10, 3, 10, (0.1705, 0.8090)),
                                                   (6, 7, 2, 7, (0.0582, 0.8062))])
def test_counts_of_seeds_get_newcombes_interval(x1, n1, x0, n0, published):
    # Newcombe (1998), Stat. Med. 17:873, Table II, method 10, as published to 4 decimals
    a = [1.0] * x1 + [0.0] * (n1 - x1)
    b = [1.0] * x0 + [0.0] * (n0 - x0)
    d, lo, hi = welch_interval(a, b, bounds=UNIT)
    assert d == pytest.approx(x1 / n1 - x0 / n0) and (lo, hi) == pytest.approx(published, abs=6e-5)


def test_zero_of_eight_against_zero_of_eight():
    d, lo, hi = welch_interval([0.0] * 8, [0.0] * 8, bounds=UNIT)
    assert d == 0 and (round(lo, 2), round(hi, 2)) == (-0.32, 0.32)
    # on an entropy's range [0, log K] the count is rescaled
    log_k = math.log(8)
    d, lo, hi = welch_interval([log_k] * 8, [0.0] * 8, bounds=(0.0, log_k))
    assert (d == pytest.approx(log_k) and hi == pytest.approx(log_k)
            and lo == pytest.approx(log_k * (1 - math.hypot(0.3245, 0.3245)), abs=1e-3))  # Newcombe, rescaled
    # one side: the Wilson interval of the count
    m, lo, hi = welch_interval([1.0, 0.0, 1.0, 1.0], bounds=UNIT)
    assert (m, lo, hi) == pytest.approx((0.75, *wilson_interval(3, 4)))


def test_the_interval_follows_the_data():
    # seeds that agree closely give a narrow interval (the worst-case bound gave about +-0.4 here)
    a, b = [0.50, 0.51, 0.52], [0.30, 0.31, 0.29]
    d, lo, hi = welch_interval(a, b, bounds=UNIT)
    assert d == pytest.approx(0.21) and (lo, hi) == pytest.approx(welch_interval(a, b)[1:])  # the Welch t interval
    assert hi - lo < 0.1 and lo > 0
    m, lo, hi = welch_interval(a, bounds=UNIT)
    assert hi - lo < 0.1 and (lo, hi) == pytest.approx(welch_interval(a)[1:])
    assert interval_p(lambda lv: welch_interval(a, b, lv, UNIT)) < 0.01


def test_a_count_against_a_varying_side_combines_their_own_intervals():
    # 0/8 seeds against a side near 0.5 with little spread: the upper end is about the count's Wilson
    # bound (0.32) above the estimate, the lower end about the varying side's t half-width below it
    rng = np.random.default_rng(0)
    b = 0.5 + 0.005 * rng.standard_normal(8)
    d, lo, hi = welch_interval([0.0] * 8, b, bounds=UNIT)
    t_half = welch_interval(b)[2] - b.mean()
    assert d == pytest.approx(-b.mean())
    assert d - lo == pytest.approx(t_half, rel=1e-6) and hi - d == pytest.approx(math.hypot(wilson_interval(0, 8)[1], t_half))


def test_a_side_without_spread_carries_no_information_but_is_never_a_point():
    d, lo, hi = welch_interval([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], bounds=UNIT)
    assert d == 0 and -1 <= lo < -0.5 and 0.5 < hi <= 1
    with pytest.raises(ValueError, match="level"):
        welch_interval([0.5, 0.4], level=1.5)
    with pytest.raises(ValueError, match="finite"):
        welch_interval([0.5, math.nan], bounds=UNIT)


def test_welch_intervals_over_seeds_cover():
    """Welch over 8 seeds per side, normal rewards clipped far from the ends: coverage of the true
    difference near 95% (a vectorised check of the interval's level on the claims' sizes)."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(1500):
        a, b = 0.6 + 0.05 * rng.standard_normal(8), 0.5 + 0.1 * rng.standard_normal(8)
        _, lo, hi = welch_interval(a, b, bounds=UNIT)
        hits += lo <= 0.1 <= hi
    assert 0.93 <= hits / 1500 <= 0.97
