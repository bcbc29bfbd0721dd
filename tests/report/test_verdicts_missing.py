"""A missing value prints as the book's missing marker, whatever pandas or
numpy calls it missing (pd.NA printed "<NA>%")."""
import math

import numpy as np
import pandas as pd
import pytest

from ctrls.report.display import MISSING
from ctrls.report.verdicts import pct, pts


@pytest.mark.parametrize("missing", [pd.NA, None, math.nan, np.float32("nan"), pd.NaT])
def test_pct_and_pts_print_the_books_missing_marker(missing):
    assert pct(missing) == MISSING
    assert pct(0.5, missing, 0.6) == MISSING and pct(0.5, 0.4, missing) == MISSING
    assert pts(missing, 0.1, 0.2) == MISSING and pts(0.1, missing, 0.2) == MISSING and pts(0.1, 0.0, missing) == MISSING


def test_values_from_a_nullable_column_print_as_numbers_or_the_marker():
    s = pd.array([0.25, pd.NA], dtype="Float64")
    assert pct(s[0], s[0], s[0]) == "25.0% [25.0, 25.0]" and pct(s[1]) == MISSING
    assert "NA" not in pts(s[1], 0.1, 0.2) + pct(s[1], 0.1, 0.2)
