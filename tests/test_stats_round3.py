"""Statistics round 3 (issue 33), items 3, 4, 5, 8, 9: verdicts that agree with their intervals and
state their direction, one label for inconclusive, values without an interval printed as such."""
import math

import pandas as pd
import pytest

from ctrls.settings import BASE, FIXED
from ctrls.tables import _fmt, diversity_table, diversity_view
from test_exploration import _samples, _with_states


def test_fmt_prints_a_value_without_interval_as_such():
    assert _fmt(9.0, math.nan, math.nan, scale=1.0, n=1) == "9.00 (n = 1, no interval)"
    assert _fmt(0.5, 0.4, 0.6) == "50 [40, 60]" or "[" in _fmt(0.5, 0.4, 0.6)
    assert "nan" not in _fmt(0.25, math.nan, math.nan)


def test_diversity_view_fixed_s0_drawn_entropy_is_fixed_by_construction():
    n = [False] * 3
    df = _with_states(_samples({BASE: [n] * 4, FIXED: [n] * 4, "eps=0.1": [n] * 4}))
    t = diversity_table(df, n_boot=50)
    v = diversity_view(t).set_index("config")
    fixed = v.loc[FIXED, "drawn-state entropy (bits)"]
    assert "fixed by construction" in fixed and "[" not in fixed
    assert "[" in v.loc["eps=0.1", "drawn-state entropy (bits)"]
    one = diversity_view(diversity_table(df[df.question_id == "q0"], n_boot=50)).set_index("config")
    assert one.loc["eps=0.1", "distinct answers"].endswith("(n = 1, no interval)")
