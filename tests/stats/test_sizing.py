"""The unbiased pass@k in the power simulation: the estimator's expectation is 1 - (1 - p)^k (checked
exactly against the binomial), the simulated test holds its level with no difference, and the design
with twice the samples has more power than McNemar on pass@n from n samples at the same rise."""
import math

import numpy as np
import pytest
from scipy.stats import binom

from ctrls.stats.sizing import pass_k, simulated_power, unbiased_pass_k


@pytest.mark.parametrize("m,k", [(8, 4), (4, 4), (5, 1), (10, 3)])
def test_the_unbiased_pass_at_k_has_expectation_one_minus_one_minus_p_to_the_k(m, k):
    c = np.arange(m + 1)
    est = unbiased_pass_k(c, m, k)
    assert est[0] == 0.0 and est[-1] == 1.0
    if k == 1:
        assert est == pytest.approx(c / m)  # pass@1 is the mean
    for p in (0.05, 0.3, 0.7):
        assert float(binom.pmf(c, m, p) @ est) == pytest.approx(1 - (1 - p) ** k, abs=1e-12)
    # against the binomial coefficients themselves
    assert est == pytest.approx([1 - math.comb(m - x, k) / math.comb(m, k) for x in c])


def test_pass_k_reads_the_statistic_and_refuses_k_above_the_samples():
    assert pass_k("pass@4") == 4 and pass_k("any") is None and pass_k("mean") is None
    with pytest.raises(ValueError, match="pass@k"):
        simulated_power(0.3, 0.1, 60, 4, 0.3, "pass@8", n_sim=10)


def test_no_difference_is_rejected_at_about_the_level():
    pw = simulated_power(0.3, 0.0, 60, 8, 0.3, "pass@4", n_sim=2000, test="permutation", n_perm=500, seed=1)
    assert pw <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 2000)


def test_twice_the_samples_with_the_unbiased_pass_at_n_has_more_power_than_mcnemar_on_n():
    kw = {"n_sim": 1000, "seed": 2, "rho": 0.7}
    four = simulated_power(0.3, 0.15, 60, 4, 0.3, "any", test="mcnemar", **kw)
    eight = simulated_power(0.3, 0.15, 60, 8, 0.3, "pass@4", test="permutation", n_perm=500, **kw)
    assert eight > four + 0.05, (four, eight)
