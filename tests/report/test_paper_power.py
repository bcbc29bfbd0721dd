"""ctrls.report.paper_power: every CTRLS-vs-Base difference of the paper's Tables 1 and 2 with its counts at the
inferred n, Newcombe's interval (checked against statsmodels' ``newcomb`` interval on every row), the MDD up and
down from Base (checked against statsmodels' power of the arcsine test), the per-table statements and the
page's narrow view; a percentage off the question grid is refused naming the row."""
import math

import numpy as np
import pandas as pd
import pytest

from ctrls.report.paper import PAPER_TABLE1, PAPER_TABLE2
from ctrls.report.paper_power import _count, paper_comparisons, paper_power, power_summary, table_statements
from ctrls.stats.power import newcombe_interval


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


def test_a_published_percentage_is_a_count_of_questions():
    assert _count(82.5, 40, "row") == 33 and _count(0.0, 40, "row") == 0 and _count(64.2, 500, "row") == 321
    with pytest.raises(ValueError, match=r"^Table 9 row: 33.3% is not a multiple of 100/40"):
        _count(33.3, 40, "Table 9 row")


def test_each_comparison_pairs_a_row_with_the_base_of_its_own_cell():
    t = paper_comparisons()
    for (bb, ds), by_eta in PAPER_TABLE1.items():
        for eta, by_row in by_eta.items():
            for label, (p20, succ) in by_row.items():
                got = t[(t.table == "Table 1") & (t.backbone == bb) & (t.dataset == ds) & (t.temperature == eta)
                        & (t.config == label)].set_index("metric")
                assert len(got) == (0 if label == "Base" else 2)
                if label != "Base":
                    assert got.loc["pass@20", "ctrls (%)"] == p20 and got.loc["Succ.", "ctrls (%)"] == succ
                    assert got.loc["pass@20", "base (%)"] == by_row["Base"][0]
                    assert got.loc["Succ.", "base (%)"] == by_row["Base"][1]
    t2 = t[t.table == "Table 2"]
    assert t2.temperature.isna().all()
    row = t2[(t2.backbone == "Llama-3.2-3B-Instruct") & (t2.dataset == "gsm8k") & (t2.config == "ε=0.1, H=0.0")]
    assert row.set_index("metric")["ctrls (%)"].to_dict() == dict(zip(("pass@20", "Succ."),
                                                                      PAPER_TABLE2["Llama-3.2-3B-Instruct"]["gsm8k"][(0.1, 0.0)]))


def test_every_interval_and_mdd_agrees_with_statsmodels():
    proportion = pytest.importorskip("statsmodels.stats.proportion")
    from statsmodels.stats.power import NormalIndPower

    t = paper_power()
    h = {n: NormalIndPower().solve_power(nobs1=n, alpha=0.05, power=0.8, ratio=1) for n in set(t.n)}
    for r in t.to_dict("records"):
        n = r["n"]
        x1, x0 = round(r["ctrls (%)"] * n / 100), round(r["base (%)"] * n / 100)
        lo, hi = proportion.confint_proportions_2indep(x1, n, x0, n, method="newcomb", compare="diff")
        assert (r["lo (pp)"], r["hi (pp)"]) == pytest.approx((100 * lo, 100 * hi), abs=1e-6)
        assert r["excludes 0"] == (lo > 0 or hi < 0)
        # the smallest rate whose arcsine distance from Base reaches the effect size of power 0.8
        phi0 = math.asin(math.sqrt(x0 / n))
        up = math.sin(phi0 + h[n] / 2) ** 2 - x0 / n if phi0 + h[n] / 2 <= math.pi / 2 else math.nan
        down = x0 / n - math.sin(phi0 - h[n] / 2) ** 2 if phi0 - h[n] / 2 >= 0 else math.nan
        assert np.allclose([r["MDD up (pp)"], r["MDD down (pp)"]], [100 * up, 100 * down], atol=1e-3, equal_nan=True)


def test_table_statements_say_whether_any_pairing_could_resolve_a_difference():
    t = pd.DataFrame({"table": ["A", "A", "B", "B", "B"], "n": [40, 40, 500, 500, 500],
                      "questions apart": [3, 5, 10, 20, 30],
                      "p, minimal discordance": [0.25, 0.0625, 0.2, 0.01, 0.001],
                      "p, maximal discordance": [1.0, 1.0, 0.9, 0.6, 0.02]})
    s = table_statements(t)
    assert s["A"] == ("A (n = 40): no difference is resolvable under any pairing of the questions: the largest is 5 "
                      "questions, and even with every discordant question one way the exact McNemar p is ≥ 0.0625.")
    assert s["B"].startswith("B (n = 500): the published rates cannot decide it: between 1 (every question the rows "
                             "could disagree on discordant) and 2 (minimal discordance) of the 3 differences")
    assert list(s) == ["A", "B"]
