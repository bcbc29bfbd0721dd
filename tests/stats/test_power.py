"""ctrls.stats.power: Newcombe's interval against the published examples, the MDD by hand and against exact power."""
import math

import numpy as np
import pytest
from scipy.stats import binom

from ctrls.stats.power import minimal_detectable_difference, newcombe_interval

# Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10 (hybrid score), 95%:
# (x1, n1, x2, n2) -> (lo, hi), as published to 4 decimals.
NEWCOMBE_1998 = [((56, 70, 48, 80), (0.0524, 0.3339)), ((9, 10, 3, 10), (0.1705, 0.8090)),
                 ((6, 7, 2, 7), (0.0582, 0.8062)), ((5, 56, 0, 29), (-0.0381, 0.1926)),
                 ((0, 10, 0, 20), (-0.1611, 0.2775)), ((0, 10, 0, 10), (-0.2775, 0.2775)),
                 ((10, 10, 0, 20), (0.6791, 1.0000)), ((10, 10, 0, 10), (0.6075, 1.0000))]


@pytest.mark.parametrize("counts,published", NEWCOMBE_1998)
def test_newcombe_interval_matches_the_published_examples(counts, published):
    d, lo, hi = newcombe_interval(*counts)
    assert d == pytest.approx(counts[0] / counts[1] - counts[2] / counts[3])
    assert (lo, hi) == pytest.approx(published, abs=6e-5)


def _power(p0: float, p1: float, n: int) -> float:
    """Exact power (sum over both binomial outcomes) of the two-sided arcsine z test at 5%."""
    x = np.arange(n + 1)
    phi = 2 * np.arcsin(np.sqrt(x / n))
    reject = np.abs(phi[:, None] - phi[None, :]) / math.sqrt(2 / n) > 1.959964
    return float((binom.pmf(x, n, p1)[:, None] * binom.pmf(x, n, p0)[None, :] * reject).sum())


def test_minimal_detectable_difference_by_hand_and_by_exact_power():
    # n = 40, p0 = 0.5: h* = (1.959964 + 0.841621) * sqrt(2 / 40) = 0.626453;
    # p1 = sin^2(pi/4 + h*/2) = sin^2(1.098622) = 0.793138, so MDD = 0.293138 either way (symmetric at 0.5)
    up, down = minimal_detectable_difference(0.5, 40)
    assert up == pytest.approx(0.293138, abs=2e-6) and down == pytest.approx(up)
    # the test it describes has power 0.8 there (exactly enumerated; discreteness moves it a little)
    assert _power(0.5, 0.5 + up, 40) == pytest.approx(0.8, abs=0.01)
    up500, _ = minimal_detectable_difference(0.642, 500)
    assert _power(0.642, 0.642 + up500, 500) == pytest.approx(0.8, abs=0.01)
    assert _power(0.642, 0.642 + up500 / 2, 500) < 0.4  # half the MDD is badly under-powered
    # from 95% at n = 40 no increase is detectable, even to 100%
    assert math.isnan(minimal_detectable_difference(0.95, 40)[0])
