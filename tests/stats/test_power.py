"""The power of the paper's tables (ctrls.stats.power): Newcombe's interval, the MDD, the paper's rows."""
import math

import numpy as np
import pytest
from scipy.stats import binom

from ctrls.report.paper_power import paper_power, power_summary
from ctrls.stats.power import minimal_detectable_difference, newcombe_interval

# Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10 (hybrid score), 95%:
# (x1, n1, x2, n2) -> (lo, hi), as published to 4 decimals.
NEWCOMBE_1998 = [((56, 70, 48, 80), (0.0524, 0.3339)), ((9, 10, 3, 10), (0.1705, 0.8090)),
                 ((6, 7, 2, 7), (0.0582, 0.8062)), ((5, 56, 0, 29), (-0.0381, 0.1926)),
                 ((0, 10, 0, 20), (-0.1611, 0.2775)), ((0, 10, 0, 10), (-0.2775, 0.2775)),
                 ((10, 10, 0, 20), (0.6791, 1.0000)), ((10, 10, 0, 10), (0.6075, 1.0000))]


@pytest.mark.parametrize("counts,published", NEWCOMBE_1998)
def test_newcombe_interval_matches_the_published_examples(counts, published):
    d, lo, hi = newcombe_interval(*counts)
    assert d == pytest.approx(counts[0] / counts[1] - counts[2] / counts[3])
    assert (lo, hi) == pytest.approx(published, abs=6e-5)


def _power(p0: float, p1: float, n: int) -> float:
    """Exact power (sum over both binomial outcomes) of the two-sided arcsine z test at 5%."""
    x = np.arange(n + 1)
    phi = 2 * np.arcsin(np.sqrt(x / n))
    reject = np.abs(phi[:, None] - phi[None, :]) / math.sqrt(2 / n) > 1.959964
    return float((binom.pmf(x, n, p1)[:, None] * binom.pmf(x, n, p0)[None, :] * reject).sum())


def test_minimal_detectable_difference_by_hand_and_by_exact_power():
    # n = 40, p0 = 0.5: h* = (1.959964 + 0.841621) * sqrt(2 / 40) = 0.626453;
    # p1 = sin^2(pi/4 + h*/2) = sin^2(1.098622) = 0.793138, so MDD = 0.293138 either way (symmetric at 0.5)
    up, down = minimal_detectable_difference(0.5, 40)
    assert up == pytest.approx(0.293138, abs=2e-6) and down == pytest.approx(up)
    # the test it describes has power 0.8 there (exactly enumerated; discreteness moves it a little)
    assert _power(0.5, 0.5 + up, 40) == pytest.approx(0.8, abs=0.01)
    up500, _ = minimal_detectable_difference(0.642, 500)
    assert _power(0.642, 0.642 + up500, 500) == pytest.approx(0.8, abs=0.01)
    assert _power(0.642, 0.642 + up500 / 2, 500) < 0.4  # half the MDD is badly under-powered
    # from 95% at n = 40 no increase is detectable, even to 100%
    assert math.isnan(minimal_detectable_difference(0.95, 40)[0])


def test_paper_power_covers_every_reported_difference():
    t = paper_power()
    # Table 1: 4 (backbone, dataset) x 2 eta x 3 eps rows; Table 2: 4 pairs x 4 RL rows; x 2 metrics
    assert (t.table == "Table 1").sum() == 48 and (t.table == "Table 2").sum() == 32
    assert set(t[t.table == "Table 1"].n) == {40} and set(t[t.table == "Table 2"].n) == {500}
    row = t[(t.table == "Table 2") & (t.backbone == "Qwen2.5-3B-Instruct") & (t.dataset == "gsm8k")
            & (t.config == "ε=0.0, H=0.01") & (t.metric == "pass@20")].iloc[0]
    d, lo, hi = newcombe_interval(332, 500, 321, 500)  # 66.4% and 64.2% of 500
    assert (row["diff (pp)"], row["lo (pp)"], row["hi (pp)"]) == pytest.approx((100 * d, 100 * lo, 100 * hi))
    assert row["diff (pp)"] == pytest.approx(2.2) and not row["excludes 0"] and row["below MDD"]
    s = power_summary(t)
    assert s.comparisons.sum() == 80


def test_power_summary_counts_the_cells_with_no_detectable_gain():
    """The median MDD skips NaN cells (Base near 100%); the summary reports how many there are beside it."""
    t = paper_power()
    s = power_summary(t).set_index(["table", "metric"])
    for (table, metric), row in s.iterrows():
        cells = t[(t.table == table) & (t.metric == metric)]
        assert row["no detectable gain"] == int(cells["MDD up (pp)"].isna().sum())
        assert row["median MDD up (pp)"] == pytest.approx(cells["MDD up (pp)"].dropna().median())
    assert s["no detectable gain"].sum() > 0  # Table 1 has Base rates of 100%: no gain is detectable there


def test_an_interval_that_excludes_zero_is_flagged():
    # the same percentages on 100x the questions: Table 2's 2-point differences become resolvable
    t = paper_power(n={"Table 1": 4000, "Table 2": 50000})
    row = t[(t.table == "Table 2") & (t.backbone == "Llama-3.2-3B-Instruct") & (t.dataset == "gsm8k")
            & (t.config == "ε=0.0, H=0.0") & (t.metric == "pass@20")].iloc[0]
    assert row["diff (pp)"] == pytest.approx(2.0) and row["lo (pp)"] > 0 and row["excludes 0"]
    assert not row["below MDD"]


def test_below_mdd_compares_with_the_mdd_in_the_direction_of_the_difference():
    # Table 1, Llama GSM8K, eta = 0.5: Base 72.5%, eps=0.5 82.5% (+10 points). At 320 questions the
    # MDD up from 72.5% is 9.3 points and the MDD down 10.4: +10 is detectable, -10 would not be.
    t = paper_power(n={"Table 1": 320, "Table 2": 500})
    row = t[(t.table == "Table 1") & (t.backbone == "Llama-3.2-3B-Instruct") & (t.dataset == "gsm8k")
            & (t.temperature == 0.5) & (t.config == "eps=0.5") & (t.metric == "pass@20")].iloc[0]
    assert row["diff (pp)"] == pytest.approx(10.0)
    assert row["MDD up (pp)"] < 10 < row["MDD down (pp)"] and not row["below MDD"]


def test_a_percentage_off_the_question_grid_is_an_error_naming_the_row():
    with pytest.raises(ValueError, match=r"Table 1 .* is not a multiple of 100/7"):
        paper_power(n={"Table 1": 7, "Table 2": 500})


def test_power_view_shows_the_frames_numbers_in_fewer_columns():
    """The page's narrow view carries the frame's rows and numbers: each interval cell reads back to the
    frame's diff, lo and hi, and no row is lost or reordered."""
    import re

    from ctrls.report.paper_power import paired_p_columns, power_view

    t = paired_p_columns(paper_power())
    v = power_view(t)
    assert len(v) == len(t) and len(v.columns) < len(t.columns)
    for cell, d, lo, hi in zip(v["diff [95% CI] (pp)"], t["diff (pp)"], t["lo (pp)"], t["hi (pp)"]):
        got = [float(x) for x in re.findall(r"[+-]\d+\.\d", cell)]
        assert got == pytest.approx([d, lo, hi], abs=0.051), cell
    assert (v["p worst"] == t["p, maximal discordance"].round(3)).all()
    assert v.attrs["note"]
