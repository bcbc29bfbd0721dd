"""ctrls.report.tables: the book's formatting of Table 1's companions and RL's summary: an interval printed with
the decimals it supports and never as "[nan, nan]", a column rounded alike, Wilson's interval against statsmodels,
and each RL setting's last evaluation beside step 0."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from ctrls.report import tables as T


def test_a_value_without_an_interval_says_so():
    assert T._fmt(0.09, math.nan, math.nan, n=1) == "9.00 (n = 1, no interval)"
    assert T._fmt(math.nan, 0.0, 1.0) == "–"
    assert T._fmt(0.5, 0.25, 0.75, sign=True, digits=1) == "+50.0 [+25.0, +75.0]"


def test_a_column_is_rounded_alike():
    col = T._fmt_column([0.0, 0.167], [-0.68, 0.02], [0.68, 0.31], sign=True)
    decimals = {len(c.split(" ")[0].split(".")[1]) if "." in c.split(" ")[0] else 0 for c in col}
    assert len(decimals) == 1, col


def test_wilson_matches_statsmodels():
    from statsmodels.stats.proportion import proportion_confint

    for k, n in ((0, 10), (3, 10), (10, 10), (17, 40)):
        assert T.wilson(k, n) == pytest.approx(proportion_confint(k, n, alpha=0.05, method="wilson"), abs=1e-9)
    assert all(math.isnan(x) for x in T.wilson(0, 0))


def test_rl_summary_puts_the_last_evaluation_beside_step_0():
    rows = []
    for seed, (a0, a1) in enumerate([(0.2, 0.4), (0.3, 0.6)]):
        for step, acc in ((0, a0), (5, a1)):
            rows.append({"pair": "smollm2-135m-instruct__gsm8k", "setting": "eps=0.1,H=0.01", "seed": seed,
                         "kind": "eval", "step": step, "accuracy": acc, "pass@k": acc, "succ": 1.0,
                         "policy_entropy": 1.0 - step / 10, "state_usage_entropy": 0.5})
    t = T.rl_summary(pd.DataFrame(rows))
    assert len(t) == 1
    acc = [c for c in t.columns if "at step 0" not in c and t[c].dtype.kind == "f" and t[c].iloc[0] == pytest.approx(0.5)]
    assert acc, t.columns  # the mean over seeds of the last step's accuracy
    assert t.filter(like="at step 0").iloc[0].tolist()[0] == pytest.approx(0.25)
    assert "step 5" in t.attrs["note"] and "2 seeds" in t.attrs["note"]
