"""kappa against the independent-chain null: exactly the steering share on a known mechanism, zero
(and covered by its interval) without steering however the read-back is biased."""
import numpy as np
import pytest

from ctrls.stats.agreement import kappa, kappa_difference, kappa_vs_null


def simulate(steer: float, n_q: int = 60, steps: int = 6, K: int = 4, seed: int = 0, bias=(0.55, 0.15, 0.15, 0.15)):
    """A known mechanism: each step reads back as its drawn state with probability ``steer``, else as a
    draw from a biased marginal (the adapter's pull), whatever was drawn. Drawn and independent chains
    come from the same (skewed) policy."""
    rng = np.random.default_rng(seed)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    drawn = rng.choice(K, size=(n_q, steps), p=p)
    indep = rng.choice(K, size=(n_q, steps), p=p)
    other = rng.choice(K, size=(n_q, steps), p=np.asarray(bias))
    read = np.where(rng.random((n_q, steps)) < steer, drawn, other)
    q = np.repeat(np.arange(n_q), steps)
    return (read == drawn).ravel().astype(int), (read == indep).ravel().astype(int), q


def test_kappa_equals_its_closed_form_on_a_known_mechanism():
    p, m = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.55, 0.15, 0.15, 0.15])
    for s in (0.0, 0.3, 0.7):
        F = s + (1 - s) * (m @ p)  # steered, or the biased read-back meets the drawn state by chance
        N = s * (p @ p) + (1 - s) * (m @ p)  # the independent chain meets the read-back
        est = np.mean([kappa_vs_null(*simulate(s, n_q=200, seed=i), n_boot=200)["kappa"] for i in range(20)])
        assert est == pytest.approx((F - N) / (1 - N), abs=0.02), s


def test_without_steering_the_interval_covers_zero_and_the_test_holds_its_size():
    cover, reject = 0, 0
    for i in range(100):
        r = kappa_vs_null(*simulate(0.0, seed=100 + i), n_boot=400, n_perm=400, seed=i)
        cover += r["kappa lo"] <= 0 <= r["kappa hi"]
        reject += r["p_value"] < 0.05
    assert cover >= 88  # nominal 95 (percentile bootstrap at 60 questions)
    assert reject <= 12  # nominal 5


def test_steering_is_detected_and_chance_against_one_over_k_would_mislead():
    r = kappa_vs_null(*simulate(0.3, seed=3))
    assert r["p_value"] < 0.01 and r["kappa lo"] > 0.1
    f, n, q = simulate(0.0, seed=4)
    assert abs(f.mean() - 0.25) > 0.02 or abs(n.mean() - 0.25) > 0.02  # the null is not 1/K
    assert kappa(0.5, 1.0) != kappa(0.5, 1.0)  # NaN: nothing left to steer


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one entry per step"):
        kappa_vs_null([1, 0], [1], [0, 0])
    with pytest.raises(ValueError, match="0/1"):
        kappa_vs_null([2, 0], [1, 0], [0, 0])
    with pytest.raises(ValueError, match="no steps"):
        kappa_vs_null([], [], [])


def test_a_paired_comparison_of_variants_finds_a_difference_and_not_a_non_difference():
    a, b = simulate(0.6, seed=5), simulate(0.1, seed=6)
    d = kappa_difference(a, b, n_perm=1000)
    assert d["diff"] > 0.3 and d["lo"] > 0 and d["p_value"] < 0.01
    same = kappa_difference(simulate(0.3, seed=7), simulate(0.3, seed=8), n_perm=1000)
    assert same["lo"] < 0 < same["hi"] and same["p_value"] > 0.05
    with pytest.raises(ValueError, match="same questions"):
        kappa_difference(a, (b[0][:6], b[1][:6], [99] * 6))
