"""Table 1 from the samples: pass@n with its Wilson interval and the paired difference to Base by hand, and a
frame of no samples or without the columns it needs is a clear ValueError."""
import pandas as pd
import pytest

from ctrls.stages import sample_tables as tables

COLUMNS = ["backbone", "dataset", "temperature", "config", "question_id", "sample_index", "correct", "valid"]


@pytest.mark.parametrize("df", [pd.DataFrame(columns=COLUMNS), pd.DataFrame()], ids=["no rows", "no columns"])
def test_table1_of_an_empty_frame_is_a_clear_value_error(df):
    with pytest.raises(ValueError, match="Table 1: no samples"):
        tables.table1(df)


def test_table1_names_the_columns_a_frame_lacks():
    with pytest.raises(ValueError, match="Table 1: the samples lack the column.*'config'"):
        tables.table1(pd.DataFrame({"backbone": ["b"], "dataset": ["d"], "temperature": [0.7]}))


def test_table1_counts_pass_at_n_per_question_and_pairs_each_row_with_base():
    """3 questions x 2 samples: Base solves question 0 only, CTRLS(0.1) questions 0 and 1. pass@n is the share of
    questions with a correct sample (1/3, 2/3), its interval Wilson's (statsmodels), the difference +1/3."""
    from statsmodels.stats.proportion import proportion_confint

    rows = []
    for cfg, solved in (("Base", {0}), ("eps=0.1", {0, 1})):
        for q in range(3):
            for m in range(2):
                rows.append({"backbone": "b", "dataset": "d", "temperature": 0.7, "config": cfg, "question_id": f"q{q}",
                             "sample_index": m, "correct": q in solved and m == 0, "valid": True})
    t = tables.table1(pd.DataFrame(rows)).set_index("config")
    assert t.loc["Base", "pass@n"] == pytest.approx(1 / 3) and t.loc["eps=0.1", "pass@n"] == pytest.approx(2 / 3)
    lo, hi = proportion_confint(2, 3, method="wilson")
    assert (t.loc["eps=0.1", "pass@n lo"], t.loc["eps=0.1", "pass@n hi"]) == pytest.approx((lo, hi))
    assert t.loc["eps=0.1", "Δ pass@n vs Base"] == pytest.approx(1 / 3) and t.loc["eps=0.1", "family"] == 1
    assert t.loc["eps=0.1", "succ"] == 1.0 and pd.isna(t.loc["Base", "Δ pass@n vs Base"])
