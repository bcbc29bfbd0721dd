"""When no judge could score (every score fell back to the scale's midpoint), the judge page says
so plainly instead of showing a table of defaults."""
from __future__ import annotations

import pandas as pd

from ctrls.generate.judge import CRITERIA, DEFAULT_SCORE
from ctrls.report import beside_paper


def _judged(default: bool) -> pd.DataFrame:
    rows = []
    for config in ("Base", "eps=0.1, H=0.01", "eps=0.0, H=0.0"):
        for i in range(3):
            scores = {k: DEFAULT_SCORE if default else 5 + i for k in CRITERIA}
            rows.append({"config": config, **scores, "parse": "default" if default else "json",
                         **{f"parse_{k}": "default" if default else "json" for k in CRITERIA}})
    return pd.DataFrame(rows)


def test_no_judge_could_score_is_said_plainly():
    judged = _judged(default=True)
    assert beside_paper.all_defaults(judged)
    statement = beside_paper.judge_statement(judged)
    assert statement.startswith("**No judge could score these outputs.**") and "9 replies" in statement
    t = beside_paper.table3_vs_paper(judged)
    assert "n (ours)" in t and not any(c.endswith("(ours)") and c != "n (ours)" for c in t.columns)
    assert t.attrs["note"].startswith("No judge could score our outputs")


def test_a_judge_that_scored_gets_its_table():
    judged = _judged(default=False)
    assert not beside_paper.all_defaults(judged) and beside_paper.judge_statement(judged) == ""
