"""The scaled run's numbers: unbiased pass@k against an enumeration of subsets, the sign-flip test against its
exact distribution, the stored file read and refused, and the stored numbers recomputed from its samples."""
import json
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ctrls.report.scaled import SCALED_RESULT, paired_pass, run_numbers, scaled_markdown, stored_scaled

REPO = Path(__file__).resolve().parents[2]


def frame(correct: list[list[int]], config: str = "x") -> pd.DataFrame:
    return pd.DataFrame([{"question_id": f"q{i}", "sample_index": j, "correct": bool(c), "config": config}
                         for i, row in enumerate(correct) for j, c in enumerate(row)])


def subsets_pass_k(row: list[int], k: int) -> float:
    """pass@k as the mean over every k-subset of the samples of "some sample in it is correct"."""
    return float(np.mean([any(row[i] for i in s) for s in combinations(range(len(row)), k)]))


def test_unbiased_pass_k_is_the_mean_over_subsets():
    rng = np.random.default_rng(0)
    a, b = rng.random((9, 6)) < 0.3, rng.random((9, 6)) < 0.5
    for k in (1, 2, 4, 6):
        r = paired_pass(frame(a.astype(int).tolist()), frame(b.astype(int).tolist()), k)
        want = np.mean([subsets_pass_k(x, k) - subsets_pass_k(y, k)
                        for x, y in zip(a.astype(int).tolist(), b.astype(int).tolist())])
        assert r["diff"] == pytest.approx(want) and r["lo"] <= r["diff"] <= r["hi"] and r["questions"] == 9


def test_sign_flip_p_matches_its_exact_distribution():
    # 8 questions, a always right and b always wrong: every question's difference is +1, and only the two
    # all-same sign patterns of 2^8 reach |sum| = 8: p = 2/256
    r = paired_pass(frame([[1]] * 8), frame([[0]] * 8), 1, n_perm=40000)
    assert r["diff"] == 1.0 and r["p"] == pytest.approx(2 / 256, abs=0.003)
    assert paired_pass(frame([[1, 0]] * 5), frame([[0, 1]] * 5), 1)["p"] == 1.0  # no difference at all


@pytest.mark.parametrize("b,msg", [([[1, 0]] * 3 + [[1]], "same m"), ([[1, 0]] * 3, "same questions")])
def test_rows_that_do_not_pair_are_refused(b, msg):
    with pytest.raises(ValueError, match=msg):
        paired_pass(frame([[1, 0]] * 4), frame(b), 1)


def test_a_k_above_the_samples_is_refused():
    with pytest.raises(ValueError, match="m >= 3"):
        paired_pass(frame([[1, 0]] * 4), frame([[0, 0]] * 4), 3)


def test_run_numbers_needs_the_fixed_row():
    df = pd.concat([frame([[1, 0]] * 3, "Base"), frame([[1, 1]] * 3, "eps=0.1")])
    with pytest.raises(ValueError, match="fixed s0"):
        run_numbers(df, 0.1)


def stored(tmp_path, **change):
    d = json.loads((REPO / SCALED_RESULT).read_text())
    for dotted, v in change.items():
        *head, last = dotted.split("__")
        node = d["result"]
        for h in head:
            node = node[h]
        node[last] = v
    p = tmp_path / "scaled.json"
    p.write_text(json.dumps(d).replace('"NaN!"', "NaN"))
    return p


def test_the_stored_run_is_read_and_shown(tmp_path):
    d = stored_scaled(stored(tmp_path))
    assert d["result"]["questions"] == 600 and d["machine"]["gpu"]
    md = scaled_markdown(None, 0.1, stored(tmp_path))
    assert "600 × 8" in md and "| questions × samples |" in md and "below** fixed s₀" in md


@pytest.mark.parametrize("change,field", [({"eps_minus_fixed_pass4__lo": 0.5}, "interval"),
                                          ({"kappa__kappa": "NaN!"}, "NaN"),
                                          ({"kappa__kappa": 3.0}, "result.kappa.kappa: 3.0 is outside"),
                                          ({"pass1": {"Base": 0.2}}, "pass1"),
                                          ({"questions": 2.5}, "result.questions: 2.5 is not an integer"),
                                          ({"samples_per_question": True}, "samples"),
                                          ({"eps_minus_fixed_pass4__p": "low"}, "pass4.p: 'low' is not a number")])
def test_a_wrong_stored_number_is_refused_naming_the_field(tmp_path, change, field):
    with pytest.raises(ValueError, match=field):
        stored_scaled(stored(tmp_path, **change))


def test_an_absent_run_says_so(tmp_path):
    assert stored_scaled(tmp_path / "none.json") is None
    assert "has not been run" in scaled_markdown(None, 0.1, tmp_path / "none.json")


def test_the_stored_pass_numbers_are_those_of_its_samples():
    d = json.loads((REPO / SCALED_RESULT).read_text())["result"]
    df = pd.read_parquet(REPO / "studies/results/scaled_demo_h200_samples.parquet", columns=["question_id", "config", "correct"])
    row, fixed, base = (df[df.config == c] for c in ("eps=0.1", "fixed s0", "Base"))
    for key, a, b, k in (("eps_minus_fixed_pass4", row, fixed, 4), ("eps_minus_base_pass4", row, base, 4),
                         ("harm_fixed_minus_base_pass1", fixed, base, 1)):
        r = paired_pass(a, b, k)
        assert (r["diff"], r["lo"], r["hi"]) == pytest.approx((d[key]["diff"], d[key]["lo"], d[key]["hi"]), abs=1e-9), key


def test_finding_two_carries_the_scaled_claim_when_stored(tmp_path):
    from ctrls.report.scaled import claim_sentence

    assert claim_sentence(tmp_path / "none.json") == ""
    d = json.loads((REPO / SCALED_RESULT).read_text())["result"]["eps_minus_fixed_pass4"]
    s = claim_sentence(stored(tmp_path))
    assert "600 questions × 8 samples" in s and f"{100 * d['diff']:+.1f}".replace("-", "−") in s
