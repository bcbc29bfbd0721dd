"""ctrls.stats.paired: the unbiased pass@k per question and the paired difference of two rows, checked against
hand computations (1 - C(m-c, k)/C(m, k) per question), the sign-flip p against an exact enumeration of the
2^n sign patterns, the bootstrap interval inside the range of the per-question differences, pairing by
question id whatever the row order, and refusal of rows that do not pair."""
import itertools
from math import comb

import numpy as np
import pandas as pd
import pytest

from ctrls.stats.paired import paired_pass, per_question_pass


def rows(correct_per_question: dict[str, int], m: int, shuffle_seed: int | None = None) -> pd.DataFrame:
    """m samples per question, the first ``c`` of them correct."""
    df = pd.DataFrame([{"question_id": q, "correct": i < c} for q, c in correct_per_question.items() for i in range(m)],
                      columns=["question_id", "correct"])
    return df if shuffle_seed is None else df.sample(frac=1, random_state=shuffle_seed).reset_index(drop=True)


def by_hand(c: int, m: int, k: int) -> float:
    return 1 - comb(m - c, k) / comb(m, k)


A = {"q1": 3, "q2": 2, "q3": 0, "q4": 1}
B = {"q1": 1, "q2": 2, "q3": 0, "q4": 0}


@pytest.mark.parametrize("k", [1, 2, 3])
def test_per_question_pass_is_the_unbiased_estimator_by_hand(k):
    got = per_question_pass(rows(A, 3, shuffle_seed=1), k)
    assert list(got.index) == ["q1", "q2", "q3", "q4"]
    assert got.to_numpy() == pytest.approx([by_hand(c, 3, k) for c in A.values()])
    if k == 1:
        assert got.to_numpy() == pytest.approx([1, 2 / 3, 0, 1 / 3])  # pass@1 is the fraction correct


@pytest.mark.parametrize("k,a,b", [(1, 0.5, 0.25), (2, 2 / 3, 5 / 12)])
def test_the_paired_difference_is_the_mean_of_the_per_question_differences(k, a, b):
    # pass@1: a = (1 + 2/3 + 0 + 1/3) / 4, b = (1/3 + 2/3 + 0 + 0) / 4; pass@2 (m = 3): a = (1 + 1 + 0 + 2/3) / 4,
    # b = (2/3 + 1 + 0 + 0) / 4
    r = paired_pass(rows(A, 3), rows(B, 3, shuffle_seed=2), k=k, n_boot=2000, n_perm=2000)
    assert (r["k"], r["samples_per_question"], r["questions"]) == (k, 3, 4)
    assert (r["a"], r["b"], r["diff"]) == pytest.approx((a, b, a - b))
    d = [by_hand(A[q], 3, k) - by_hand(B[q], 3, k) for q in A]
    assert min(d) - 1e-12 <= r["lo"] <= r["diff"] <= r["hi"] <= max(d) + 1e-12


def exact_sign_flip_p(d) -> float:
    d = np.asarray(d, float)
    hits = [abs(np.dot(s, d)) >= abs(d.sum()) - 1e-9 for s in itertools.product((-1.0, 1.0), repeat=len(d))]
    return float(np.mean(hits))


@pytest.mark.parametrize("a,b", [({f"q{i}": 1 for i in range(6)}, {f"q{i}": 0 for i in range(6)}),  # d = 1 six times
                                 (A, B),
                                 ({"q1": 1, "q2": 0, "q3": 1, "q4": 1, "q5": 0}, {"q1": 0, "q2": 1, "q3": 0, "q4": 1, "q5": 0})])
def test_the_sign_flip_p_matches_the_exact_enumeration(a, b):
    r = paired_pass(rows(a, 3), rows(b, 3), n_perm=20000, seed=3)
    d = [by_hand(a[q], 3, 1) - by_hand(b[q], 3, 1) for q in a]
    exact = exact_sign_flip_p(d)
    assert r["p"] == pytest.approx(exact, abs=4 * np.sqrt(exact * (1 - exact) / 20000) + 1e-4)
    assert r["p"] > 0  # never 0: the observed signs are one of the permutations


def test_the_same_seed_gives_the_same_interval_and_p():
    one, two = (paired_pass(rows(A, 3), rows(B, 3), n_boot=500, n_perm=500, seed=7) for _ in range(2))
    assert one == two


def test_rows_of_other_questions_or_sample_counts_are_refused():
    with pytest.raises(ValueError, match="do not cover the same questions"):
        paired_pass(rows(A, 3), rows({"q1": 1, "q2": 1, "q3": 1}, 3))
    with pytest.raises(ValueError, match="do not cover the same questions"):
        paired_pass(rows(A, 3), rows({**B, "q5": 1}, 3))
    with pytest.raises(ValueError, match="the same m >= 1 samples"):
        paired_pass(rows(A, 3), rows(B, 4))
    with pytest.raises(ValueError, match="the same m >= 4 samples"):
        paired_pass(rows(A, 3), rows(B, 3), k=4)
    with pytest.raises(ValueError, match="the same m >= 1 samples for every question"):
        per_question_pass(pd.concat([rows({"q1": 1}, 2), rows({"q2": 1}, 3)]))
    with pytest.raises(ValueError, match="do not cover the same questions"):
        paired_pass(rows({}, 3), rows({}, 3))
