"""pass@k (paper and unbiased), Succ., and bootstrap intervals, on hand-computed cases."""
from math import comb

import numpy as np
import pytest

from ctrls.stats.metrics import (
    bootstrap_ci,
    metric_with_ci,
    paired_bootstrap,
    pass_at_k,
    pass_at_k_paper,
    pass_at_k_unbiased,
    success_rate,
)

C = np.array([[0, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=bool)


def test_hand_computed_cases():
    assert pass_at_k_paper(C) == pytest.approx(2 / 3)
    assert success_rate(np.array([[1, 0], [1, 1]], dtype=bool)) == 0.75
    # n = 4, c = 1, k = 2: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k_unbiased(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k_unbiased(4, 0, 3) == 0.0 and pass_at_k_unbiased(4, 2, 3) == 1.0
    assert pass_at_k(C, 1) == pytest.approx(np.mean([0.25, 0.0, 1.0]))
    assert pass_at_k(C, 2) == pytest.approx(np.mean([0.5, 0.0, 1.0]))


def test_unbiased_estimator_matches_the_binomial_formula():
    for n, c, k in [(20, 3, 5), (20, 0, 1), (10, 9, 2), (200, 7, 20)]:
        assert pass_at_k_unbiased(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), rel=1e-10)
    with pytest.raises(ValueError):
        pass_at_k_unbiased(4, 5, 2)


def test_vectorised_pass_at_k_equals_the_scalar_estimator():
    M = np.random.default_rng(3).random((40, 12)) < 0.2
    for k in (1, 3, 12):
        assert pass_at_k(M, k) == pytest.approx(np.mean([pass_at_k_unbiased(12, int(r.sum()), k) for r in M]))


def test_unbiased_estimator_equals_the_papers_definition_at_k_equals_n():
    M = np.random.default_rng(0).random((50, 20)) < 0.07
    assert pass_at_k(M, 20) == pytest.approx(pass_at_k_paper(M))
    assert pass_at_k(M, 1) == pytest.approx(M.mean())
    with pytest.raises(ValueError, match="k=21"):
        pass_at_k(M, 21)


def test_bad_shapes_are_errors():
    with pytest.raises(ValueError, match="shape"):
        pass_at_k_paper(np.zeros(5, dtype=bool))
    with pytest.raises(ValueError, match="shape"):
        success_rate(np.zeros((0, 4), dtype=bool))
    with pytest.raises(ValueError, match="finite"):
        bootstrap_ci(np.array([0.5, np.nan]))


def test_confidence_intervals_cover_and_shrink():
    rng = np.random.default_rng(1)
    small = rng.random((20, 8)) < 0.05
    large = rng.random((400, 8)) < 0.05
    v, lo, hi = metric_with_ci(small, pass_at_k_paper, n_boot=500)
    V, LO, HI = metric_with_ci(large, pass_at_k_paper, n_boot=500)
    assert v == pass_at_k_paper(small) and lo <= v <= hi and LO <= V <= HI
    assert (HI - LO) < (hi - lo) / 2
    m, lo, hi = bootstrap_ci(np.r_[np.zeros(50), np.ones(50)], n_boot=500)
    assert m == 0.5 and lo < 0.5 < hi and hi - lo < 0.3
    M, LO, HI = bootstrap_ci(np.r_[np.zeros(500), np.ones(500)], n_boot=500)
    assert M == 0.5 and (HI - LO) < (hi - lo) / 2
    assert bootstrap_ci(np.full(10, 0.3), n_boot=50) == pytest.approx((0.3, 0.3, 0.3))


def test_paired_bootstrap():
    rng = np.random.default_rng(2)
    a = rng.random((60, 5)) < 0.3
    same = paired_bootstrap(a, a, pass_at_k_paper, n_boot=300)
    assert same == {"diff": 0.0, "lo": 0.0, "hi": 0.0, "p_value": 1.0}
    better = a | (rng.random(a.shape) < 0.5)
    res = paired_bootstrap(better, a, pass_at_k_paper, n_boot=300)
    assert res["diff"] == pytest.approx(pass_at_k_paper(better) - pass_at_k_paper(a))
    assert res["diff"] > 0 and res["lo"] > 0 and res["p_value"] < 0.05
    rev = paired_bootstrap(a, better, pass_at_k_paper, n_boot=300)
    assert rev["diff"] == -res["diff"] and rev["hi"] < 0 and rev["p_value"] < 0.05
    noise = paired_bootstrap(rng.random((60, 5)) < 0.3, a, pass_at_k_paper, n_boot=300)
    assert noise["p_value"] > 0.05
    with pytest.raises(ValueError, match="same questions"):
        paired_bootstrap(a, a[:10], pass_at_k_paper)


# ---- rates: Wilson, Newcombe's paired difference, McNemar, Holm, p-value printing ------------------

from ctrls.stats.metrics import format_p, holm, mcnemar_exact, paired_rate_difference, rate_interval  # noqa: E402
from ctrls.stats.power import newcombe_interval, wilson_interval  # noqa: E402


def test_wilson_ends_are_exact_and_contain_the_estimate():
    # at x = 0 the closed form leaves ~1e-17 from rounding for some n; a table check lo <= p then fails
    for n in [1, 2, 3, 7, 8, 12, 24, 40, 96, 4.5, 17.3]:
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
        for x in [0, n / 3, n / 2, n]:
            lo, hi = wilson_interval(x, n)
            assert lo <= x / n <= hi


def test_rate_interval_is_wilson_per_question_and_never_a_point():
    ones = np.ones(40)
    r = rate_interval(ones, ones)  # 40/40: the bootstrap gave [1, 1]
    assert r["rate"] == 1.0 and r["hi"] == 1.0 and r["lo"] == pytest.approx(40 / (40 + 1.959964 ** 2))
    r0 = rate_interval(np.zeros(40), ones)
    assert r0["lo"] == 0.0 and r0["hi"] == pytest.approx(1.959964 ** 2 / (40 + 1.959964 ** 2))
    x = (np.arange(40) % 3 == 0).astype(float)  # n_q = 1: plain Wilson over questions
    assert (rate_interval(x, ones)["lo"], rate_interval(x, ones)["hi"]) == pytest.approx(wilson_interval(int(x.sum()), 40))
    # clustered: samples identical within a question count once; independent ones count fully
    rng = np.random.default_rng(0)
    same = rng.random(200) < 0.4
    r_same = rate_interval(same * 10.0, np.full(200, 10.0))
    # 200 questions, times the small-sample factors (Q - 1) / Q of the clustered variance over
    # (N - 1) / N of the binomial one (module docstring)
    assert r_same["n_eff"] == pytest.approx(200 * (199 / 200) * (2000 / 1999))
    indep = rng.random((200, 10)) < 0.4
    assert rate_interval(indep.sum(1), np.full(200, 10.0))["n_eff"] == pytest.approx(2000, rel=0.15)
    with pytest.raises(ValueError, match="0 <= successes <= trials"):
        rate_interval([3], [2])
    with pytest.raises(ValueError, match="one length"):
        rate_interval([1, 2], [3])


def test_paired_difference_is_newcombes_and_covers():
    # phi = 0 (a balanced 2x2 table): Newcombe's paired interval is the independent hybrid score one
    a, b = np.array([1, 1, 0, 0] * 5, float), np.array([1, 0, 1, 0] * 5, float)
    one = np.ones(20)
    d = paired_rate_difference(a, one, b, one)
    assert d["r"] == pytest.approx(0.0) and (d["diff"], d["lo"], d["hi"]) == pytest.approx(newcombe_interval(10, 20, 10, 20))
    # identical 100% rows: a non-degenerate interval around 0 (where a bootstrap gives the degenerate [0, 0])
    same = paired_rate_difference(one, one, one, one)
    assert same["lo"] < 0 < same["hi"] and same["p_value"] == 1.0
    # coverage of the true difference near 95% for correlated binary pairs, n = 40
    rng = np.random.default_rng(3)
    hits, reps = 0, 1000
    for _ in range(reps):
        z = rng.random(40)
        xa, xb = (z < 0.7).astype(float), ((z < 0.55) | (rng.random(40) < 0.1)).astype(float)
        r = paired_rate_difference(xa, np.ones(40), xb, np.ones(40))
        hits += r["lo"] <= 0.7 - (0.55 + 0.45 * 0.1) <= r["hi"]
    assert 0.93 <= hits / reps <= 0.99


def test_mcnemar_holm_and_p_printing():
    a = np.array([1] * 10 + [0] * 5, bool)
    b = np.zeros(15, bool)
    assert mcnemar_exact(a, b) == pytest.approx(2 * 0.5 ** 10)
    assert mcnemar_exact(a, a) == 1.0
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adj = holm([0.02, np.nan, 0.5])
    assert np.isnan(adj[1]) and adj[[0, 2]] == pytest.approx([0.04, 0.5])
    assert format_p(0.0) == "<1e-4" and format_p(3e-12) == "<1e-4" and format_p(0.0123) == "0.012"
    assert format_p(float("nan")) == "–"
    with pytest.raises(ValueError, match="p-value"):
        format_p(1.5)
