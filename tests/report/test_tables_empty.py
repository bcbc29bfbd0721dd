"""Table 1 of no samples is a clear ValueError, not an AttributeError."""
import pandas as pd
import pytest

from ctrls.report import tables

COLUMNS = ["backbone", "dataset", "temperature", "config", "question_id", "sample_index", "correct", "valid"]


@pytest.mark.parametrize("df", [pd.DataFrame(columns=COLUMNS), pd.DataFrame()], ids=["no rows", "no columns"])
def test_table1_of_an_empty_frame_is_a_clear_value_error(df):
    with pytest.raises(ValueError, match="Table 1: no samples"):
        tables.table1(df)


def test_table1_names_the_columns_a_frame_lacks():
    with pytest.raises(ValueError, match="Table 1: the samples lack the column.*'config'"):
        tables.table1(pd.DataFrame({"backbone": ["b"], "dataset": ["d"], "temperature": [0.7]}))
