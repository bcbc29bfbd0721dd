"""Degenerate input is refused with an error that names what is wrong, never turned into a number."""
import math

import numpy as np
import pytest

from ctrls.report.verdicts import claim_verdict, direction
from ctrls.stats.metrics import bootstrap_ci, mcnemar_exact, pass_at_k_unbiased
from ctrls.stats.power import newcombe_interval, wilson_interval
from ctrls.stats.sizing import icc_from_rates, simulated_power


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.05, 1.5, math.nan])
def test_wilson_refuses_an_alpha_outside_0_1(alpha):
    with pytest.raises(ValueError, match="alpha must lie in"):
        wilson_interval(3, 10, alpha)
    assert wilson_interval(3, 10, 0.05) == pytest.approx((0.1078, 0.6032), abs=1e-4)  # the closed form by hand


def test_wilson_is_elementwise_on_arrays():
    lo, hi = wilson_interval(np.array([0, 3, 10]), np.array([10, 10, 10]))
    for i, x in enumerate([0, 3, 10]):
        assert (lo[i], hi[i]) == pytest.approx(wilson_interval(x, 10))
    with pytest.raises(ValueError, match="0 <= x <= n"):
        wilson_interval(np.array([1, 11]), np.array([10, 10]))


@pytest.mark.parametrize("rates,what", [([0.2, math.nan, 0.5], "NaN"), ([0.2, 1.5, 0.5], r"\[0, 1\]"),
                                        ([20.0, 40.0, 50.0], r"\[0, 1\]"), ([0.2, -0.1], r"\[0, 1\]")])
def test_icc_refuses_nan_and_rates_outside_0_1(rates, what):
    with pytest.raises(ValueError, match=what):
        icc_from_rates(np.array(rates), 8)


@pytest.mark.parametrize("kw,what", [({"delta": math.nan}, "delta is nan"), ({"p0": math.nan}, "p0 is nan"),
                                     ({"icc": math.nan}, "icc is nan"), ({"n_sim": 0}, "n_sim"),
                                     ({"alpha": 0.0}, "alpha")])
def test_simulated_power_refuses_nan_and_no_runs(kw, what):
    args = {"p0": 0.3, "delta": 0.1, "n_q": 20, "m": 4, "icc": 0.3, "n_sim": 50} | kw
    with pytest.raises(ValueError, match=what):
        simulated_power(**args)


def test_mcnemar_refuses_arrays_of_different_lengths():
    a = np.array([1, 0, 1, 1], bool)
    with pytest.raises(ValueError, match="one length"):
        mcnemar_exact(a, a[:3])
    with pytest.raises(ValueError, match="one length"):
        mcnemar_exact(a, np.array([True]))  # broadcasting would have compared every pair with one outcome
    assert mcnemar_exact(a, ~a) == pytest.approx(2 * (1 + 4) / 16)  # 3 vs 1 discordant: 2 P(Bin(4, 1/2) <= 1)


@pytest.mark.parametrize("n,c,k", [(10, 2.5, 3), (10.5, 2, 3), (10, 2, 1.5), (10, math.nan, 3), (10, True, 3)])
def test_pass_at_k_refuses_non_integer_counts(n, c, k):
    with pytest.raises(ValueError, match="integer counts"):
        pass_at_k_unbiased(n, c, k)


def test_pass_at_k_accepts_integral_values_of_any_type():
    assert pass_at_k_unbiased(np.int64(4), 1.0, 2) == pytest.approx(0.5)


@pytest.mark.parametrize("args,side", [((1, 0, 3, 10), "first"), ((3, 10, 0, 0), "second")])
def test_newcombe_refuses_zero_trials(args, side):
    with pytest.raises(ValueError, match=f"the {side} proportion has 0 trials"):
        newcombe_interval(*args)


def test_verdicts_of_a_nan_estimate_are_errors():
    with pytest.raises(ValueError, match="needs an estimate"):
        direction(math.nan, 0.01)  # read as "lower" before
    with pytest.raises(ValueError, match="needs an estimate"):
        direction(np.float64("nan"), 0.4)
    with pytest.raises(ValueError, match="needs an estimate"):
        claim_verdict(math.nan, 0.001)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        direction(0.1, 1.5)
    with pytest.raises(ValueError, match="side"):
        claim_verdict(0.1, 0.001, side=0)
    assert direction(math.nan, math.nan) == "not computed"  # nothing computed: said so, not an error


def test_bootstrap_of_one_value_has_no_interval():
    m, lo, hi = bootstrap_ci(np.array([0.7]), n_boot=50)
    assert m == 0.7 and math.isnan(lo) and math.isnan(hi)  # not the zero-width [0.7, 0.7]
    m, lo, hi = bootstrap_ci(np.array([0.7, 0.2]), n_boot=50)
    assert lo < hi
    with pytest.raises(ValueError, match="alpha"):
        bootstrap_ci(np.array([0.7]), alpha=2.0)
