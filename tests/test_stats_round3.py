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


def test_table1_family_interval_and_one_family_per_comparison():
    """Table 1's intervals are at 1 - 0.05/m over its m comparisons with Base (Bonferroni, the footing
    of the Holm verdict); fixed s0 − Base is the ablation's comparison only (one family per page)."""
    import numpy as np

    from ctrls.metrics import holm, paired_rate_difference
    from ctrls.tables import ablation_table, table1, vs_base_view

    rng = np.random.default_rng(0)
    draw = lambda p: [[bool(x) for x in rng.random(3) < p] for _ in range(30)]  # noqa: E731
    df = _samples({BASE: draw(0.3), FIXED: draw(0.4), "eps=0.1": draw(0.6), "eps=0.3": draw(0.5)})
    t = table1(df, n_boot=50).set_index("config")
    assert math.isnan(t.loc[FIXED, "p"]) and math.isnan(t.loc[FIXED, "p (Holm)"])
    assert (t.loc[["eps=0.1", "eps=0.3"], "family"] == 2).all()
    assert np.allclose(t.loc[["eps=0.1", "eps=0.3"], "p (Holm)"], holm(t.loc[["eps=0.1", "eps=0.3"], "p"]))
    anyc = lambda c: np.array([any(r) for r in c], float)  # noqa: E731
    by = {c: anyc(df[df.config == c].sort_values(["question_id", "sample_index"]).groupby("question_id").correct
                  .apply(list)) for c in (BASE, "eps=0.1")}
    ones = np.ones(30)
    fam = paired_rate_difference(by["eps=0.1"], ones, by[BASE], ones, alpha=0.025)
    one = paired_rate_difference(by["eps=0.1"], ones, by[BASE], ones)
    assert t.loc["eps=0.1", "Δ lo"] == pytest.approx(fam["lo"]) and t.loc["eps=0.1", "Δ hi"] == pytest.approx(fam["hi"])
    assert fam["lo"] < one["lo"] and fam["hi"] > one["hi"]  # the family interval is the wider one
    assert list(vs_base_view(table1(df, n_boot=50)).config) == ["eps=0.1", "eps=0.3"]
    a = ablation_table(df, n_boot=50)
    assert (a.family == 2 * len(a)).all() and f"{FIXED} − {BASE}" in set(a.comparison)
