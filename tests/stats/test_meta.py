"""Random-effects pooling over runs, checked against DerSimonian-Laird and HKSJ written out by hand, a
Monte-Carlo coverage of the interval under the model, and the power of a null effect."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from ctrls.stats.meta import paired_mean, pooled_power, random_effects, two_stage_bootstrap


def by_hand(y, v):
    """DerSimonian & Laird's tau^2, the random-effects mean, the HKSJ interval and Higgins' prediction interval."""
    y, v = np.asarray(y, float), np.asarray(v, float)
    k, w = len(y), 1 / v
    mu_fe = (w * y).sum() / w.sum()
    q = (w * (y - mu_fe) ** 2).sum()
    tau2 = max(0.0, (q - (k - 1)) / (w.sum() - (w ** 2).sum() / w.sum()))
    ws = 1 / (v + tau2)
    mu = (ws * y).sum() / ws.sum()
    se_hk = math.sqrt((ws * (y - mu) ** 2).sum() / ((k - 1) * ws.sum()))
    t = st.t.ppf(0.975, k - 1)
    half = st.t.ppf(0.975, k - 2) * math.sqrt(tau2 + 1 / ws.sum())
    return mu, mu - t * se_hk, mu + t * se_hk, math.sqrt(tau2), q, mu - half, mu + half


def test_the_pooled_numbers_are_dersimonian_laird_with_hksj():
    y = [0.033, 0.375, 0.412, 0.033, 0.30, -0.088]
    v = [0.0030, 0.0041, 0.0039, 0.0028, 0.0045, 0.0013]
    r = random_effects(y, v)
    mu, lo, hi, tau, q, plo, phi = by_hand(y, v)
    assert r["estimate"] == pytest.approx(mu) and r["tau"] == pytest.approx(tau) and r["q"] == pytest.approx(q)
    assert (r["lo"], r["hi"]) == pytest.approx((lo, hi)) and (r["pred_lo"], r["pred_hi"]) == pytest.approx((plo, phi))
    assert r["i2"] == pytest.approx((q - 5) / q) and r["n_seeds"] == 6
    assert r["pred_lo"] < r["lo"] < r["estimate"] < r["hi"] < r["pred_hi"]  # one new run spreads wider than the mean


def test_the_pooled_numbers_are_those_of_statsmodels_where_its_tau2_is_positive():
    import warnings

    from statsmodels.stats.meta_analysis import combine_effects

    y, v = np.array([0.033, 0.375, 0.412, 0.033, 0.30]), np.array([0.003, 0.004, 0.004, 0.003, 0.004])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = combine_effects(y, v, method_re="chi2", use_t=True)
    r = random_effects(y, v)
    assert ref.tau2 > 0 and r["tau"] ** 2 == pytest.approx(ref.tau2) and r["estimate"] == pytest.approx(ref.mean_effect_re)
    assert r["se"] == pytest.approx(math.sqrt(ref.var_hksj_re)) and r["q"] == pytest.approx(ref.q)


def test_homogeneous_runs_have_no_between_run_spread():
    r = random_effects([0.1, 0.12, 0.09, 0.1], [0.01, 0.02, 0.01, 0.03])
    assert r["tau"] == 0 and r["i2"] == 0 and r["lo"] < r["estimate"] < r["hi"]
    same = random_effects([0.1, 0.1, 0.1], [0.0, 0.0, 0.0])  # runs that all agree, with no within-run noise
    assert (same["estimate"], same["lo"], same["hi"], same["pred_lo"]) == (0.1, 0.1, 0.1, 0.1)


def test_the_interval_covers_the_mean_at_its_level_under_the_model():
    rng = np.random.default_rng(1)
    k, tau, hit, pred_hit, n = 8, 0.15, 0, 0, 1500
    v = rng.uniform(0.001, 0.006, k)
    for _ in range(n):
        y = 0.05 + tau * rng.standard_normal(k) + np.sqrt(v) * rng.standard_normal(k)
        r = random_effects(y, v)
        hit += r["lo"] <= 0.05 <= r["hi"]
        new = 0.05 + tau * rng.standard_normal() + math.sqrt(v[0]) * rng.standard_normal()
        pred_hit += r["pred_lo"] <= new <= r["pred_hi"]
    assert 0.92 <= hit / n <= 0.98 and 0.92 <= pred_hit / n <= 0.995


def test_a_null_effect_is_found_at_most_at_the_one_sided_level():
    p = pooled_power(0.0, 0.1, [0.002] * 8, n_sims=1500, seed=3)
    assert p <= 0.045
    assert pooled_power(0.3, 0.05, [0.002] * 8, n_sims=300) > 0.9


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="at least 2 runs"):
        random_effects([0.1], [0.01])
    with pytest.raises(ValueError, match="finite"):
        random_effects([0.1, float("nan")], [0.01, 0.01])
    with pytest.raises(ValueError, match="at least 2 questions"):
        paired_mean([1.0], [0.0])


def test_paired_mean_and_the_two_stage_bootstrap():
    d, var = paired_mean([1, 0, 1, 1], [0, 0, 1, 0])
    assert d == 0.5 and var == pytest.approx(np.var([1, 0, 0, 1], ddof=1) / 4)
    b = two_stage_bootstrap([np.array([0.1, 0.3]), np.array([0.5, 0.7]), np.array([0.2, 0.2])], n_boot=500)
    assert b["estimate"] == pytest.approx(np.mean([0.2, 0.6, 0.2])) and b["lo"] < b["estimate"] < b["hi"]


def test_bounds_cut_both_intervals_to_the_quantitys_range_and_say_so():
    y, v = [0.6, -0.1, 0.9, 0.0], [0.01, 0.01, 0.01, 0.01]
    free, cut = random_effects(y, v), random_effects(y, v, bounds=(-1.0, 1.0))
    assert free["pred_hi"] > 1 and cut["pred_hi"] == 1.0 and cut["clipped"] and cut["estimate"] == free["estimate"]
    assert random_effects([0.1, 0.12, 0.09], [0.01] * 3, bounds=(-1, 1))["clipped"] is False

