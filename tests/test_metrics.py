import numpy as np
import pytest

from ctrls.metrics import (bootstrap_ci, metric_with_ci, paired_bootstrap, pass_at_k, pass_at_k_paper,
                           pass_at_k_unbiased, success_rate)

C = np.array([[0, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=bool)


def test_hand_computed_cases():
    assert pass_at_k_paper(C) == pytest.approx(2 / 3)
    assert success_rate(np.array([[1, 0], [1, 1]], dtype=bool)) == 0.75
    # n = 4, c = 1, k = 2: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k_unbiased(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k_unbiased(4, 0, 3) == 0.0 and pass_at_k_unbiased(4, 2, 3) == 1.0
    assert pass_at_k(C, 1) == pytest.approx(np.mean([0.25, 0.0, 1.0]))


def test_unbiased_estimator_equals_the_papers_definition_at_k_equals_n():
    rng = np.random.default_rng(0)
    M = rng.random((50, 20)) < 0.07
    assert pass_at_k(M, 20) == pytest.approx(pass_at_k_paper(M))
    assert pass_at_k(M, 1) == pytest.approx(M.mean())
    with pytest.raises(ValueError):
        pass_at_k(M, 21)


def test_confidence_intervals_cover_and_shrink():
    rng = np.random.default_rng(1)
    small = rng.random((20, 8)) < 0.05
    large = rng.random((400, 8)) < 0.05
    v, lo, hi = metric_with_ci(small, pass_at_k_paper, n_boot=500)
    V, LO, HI = metric_with_ci(large, pass_at_k_paper, n_boot=500)
    assert lo <= v <= hi and LO <= V <= HI
    assert (HI - LO) < (hi - lo) / 2
    m, l, h = bootstrap_ci(np.r_[np.zeros(50), np.ones(50)], n_boot=500)
    assert m == 0.5 and l < 0.5 < h


def test_paired_bootstrap():
    rng = np.random.default_rng(2)
    a = rng.random((60, 5)) < 0.3
    same = paired_bootstrap(a, a, pass_at_k_paper, n_boot=300)
    assert same["diff"] == 0 and same["lo"] == 0 and same["hi"] == 0 and same["p_value"] == 1.0
    better = a | (rng.random(a.shape) < 0.5)
    res = paired_bootstrap(better, a, pass_at_k_paper, n_boot=300)
    assert res["diff"] > 0 and res["lo"] > 0 and res["p_value"] < 0.05
    with pytest.raises(ValueError):
        paired_bootstrap(a, a[:10], pass_at_k_paper)
