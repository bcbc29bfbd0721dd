"""Conclusions computed, not typed (ctrls.report.verdicts): the verdict logic on hand-made inputs."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ctrls.report.verdicts import Claim, box, claim_verdict, direction, exploration_sentences, rl_verdicts, scorecard_markdown


def test_direction_and_claim_verdicts():
    assert direction(0.1, 0.01) == "higher" and direction(-0.1, 0.01) == "lower"
    # the adjusted p must be below 0.05; the verdict then states the estimate's direction
    assert direction(0.3, 0.05) == "no detectable difference (the estimate is higher: +30.0 points)"
    assert direction(0.1, math.nan) == "not computed"
    assert claim_verdict(0.1, 0.001) == "supported" and claim_verdict(-0.1, 0.001) == "contradicted"
    assert claim_verdict(-0.1, 0.001, side=-1) == "supported"  # a claimed fall
    assert claim_verdict(0.5, 0.2) == "not supported: the estimate is in the claimed direction (+50.0 points)"
    # the exploration page's eps=0.1 vs Base: an estimate opposite to the claim is never "not shown"
    assert claim_verdict(-0.225, 0.19) == "not supported: the estimate is in the opposite direction (−22.5 points)"


def test_verdict_agrees_with_the_interval_beside_it():
    """An interval that excludes 0 never stands beside a bare "no detectable difference", and a
    rejection whose family interval includes 0 is not called a difference."""
    v = direction(-0.225, 0.19, lo=-0.41, hi=-0.013)
    assert v.startswith("no detectable difference (the estimate is lower: −22.5 points") and "excludes 0" in v
    v = direction(0.2, 0.01, lo=-0.01, hi=0.4)
    assert v.startswith("no detectable difference") and "includes 0" in v
    assert direction(0.2, 0.01, lo=0.05, hi=0.4) == "higher"
    assert claim_verdict(0.2, 0.01, lo=-0.01, hi=0.4).startswith("not supported: the estimate is in the claimed")
    assert claim_verdict(-0.2, 0.01, lo=-0.4, hi=-0.05) == "contradicted"


def _curves(per_setting: dict[str, tuple[list[int], list[int]]], seeds=(0, 1, 2), n_q=24, samples=2) -> pd.DataFrame:
    """Eval rows: for each setting, every seed has the step-0 and step-20 per-question counts given."""
    rows = []
    for setting, (c0, c20) in per_setting.items():
        for seed in seeds:
            for step, c in ((0, c0), (10, c0), (20, c20)):
                rows.append({"pair": "bb__ds", "setting": setting, "seed": seed, "kind": "eval", "step": step,
                             "correct_by_question": list(c), "samples_per_question": samples,
                             "accuracy": float(np.mean(c)) / samples})
    return pd.DataFrame(rows)


def test_rl_verdicts_learned_unchanged_worse():
    n = 24
    low, high = [0] * n, [2] * n
    mid = [1, 0] * (n // 2)
    t = rl_verdicts(_curves({"up": (low, high), "flat": (mid, mid), "down": (high, low)}))
    v = dict(zip(t.setting, t.verdict))
    assert v["up"] == "learned" and v["down"] == "got worse"
    assert v["flat"] == "no detectable change (the estimate is zero: +0.0 points)"
    assert (t.family == 3).all()
    up = t[t.setting == "up"].iloc[0]
    assert up["accuracy at step 0"] == 0 and up["accuracy at the end"] == 1 and up["samples per question"] == 6
    assert (t["p (Holm)"] >= t.p - 1e-12).all() and up["Δ lo"] > 0 and up["Δ hi"] <= 1


def test_rl_verdict_small_rise_is_not_detected():
    n = 24
    c0 = [0] * n
    c1 = [1] + [0] * (n - 1)  # one more correct sample in 144: no detectable change
    t = rl_verdicts(_curves({"tiny": (c0, c1)}))
    assert t.verdict.iloc[0].startswith("no detectable change (the estimate is higher")
    assert t["Δ lo"].iloc[0] < 0 < t["Δ hi"].iloc[0]


def test_rl_verdicts_need_per_question_results():
    with pytest.raises(ValueError, match="correct_by_question"):
        rl_verdicts(pd.DataFrame({"pair": ["p"], "setting": ["s"], "seed": [0], "kind": ["eval"], "step": [0]}))


def test_exploration_sentences_read_the_tables():
    table = pd.DataFrame([
        {"dataset": "wp", "config": "Base", "temperature": 0.7, "questions": 64, "samples": 4, "pass@n": 0.5, "pass@n lo": 0.38,
         "pass@n hi": 0.62, "succ": 0.9, "succ lo": 0.85, "succ hi": 0.94, "p": math.nan},
        {"dataset": "wp", "config": "eps=0.1", "temperature": 0.7, "questions": 64, "samples": 4, "pass@n": 0.7,
         "pass@n lo": 0.58, "pass@n hi": 0.8, "succ": 0.9, "succ lo": 0.85, "succ hi": 0.94, "Δ pass@n vs Base": 0.2,
         "Δ lo": 0.08, "Δ hi": 0.32, "p": 0.001, "p (Holm)": 0.002}])
    s = exploration_sentences(table, pd.DataFrame(), pd.DataFrame())
    assert "50.0% [38.0, 62.0]" in s[0] and "+20.0 points [+8.0, +32.0]" in s[1] and "**higher**" in s[1]
    assert s[1].startswith("wp, η = 0.7: eps=0.1 vs Base, pass@4 70.0% vs 50.0%")
    table.loc[1, "p (Holm)"] = 0.3
    assert "**no detectable difference (the estimate is higher: +20.0 points; the family interval excludes 0" in \
        exploration_sentences(table, pd.DataFrame(), pd.DataFrame())[1]


def test_scorecard_markdown_and_box():
    md = scorecard_markdown([Claim("a | b", "Table 1", "x", "supported", "generated/02_exploration")], "run X")
    assert md.startswith("*run X*") and "a \\| b" in md and "{doc}`/generated/02_exploration`" in md
    assert box(["one", "two"]).count("> - ") == 2 and "Nothing to report" in box([])


def test_missing_values_never_print_nan():
    from ctrls.report.verdicts import pct, pts

    assert pts(math.nan, 0.1, 0.2) == "—" and pct(0.5, math.nan, 0.6) == "—"  # the book's missing marker
    assert "nan" not in pts(0.1, -0.1, 0.3) + pct(0.25, 0.1, 0.4)
