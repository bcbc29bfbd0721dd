"""The book's table display (ctrls.report.display): whole, no default index, constant columns said once,
no nan/None, floats rounded."""
import math

import numpy as np
import pandas as pd

from ctrls.report.display import constant_columns, fmt, frame_html


def test_cells_are_rounded_and_missing_values_are_a_dash():
    assert fmt(float("nan")) == "—" and fmt(None) == "—" and fmt(pd.NA) == "—"
    assert fmt(0.123456789) == "0.123" and fmt(12.3456) == "12.3" and fmt(1234.567) == "1235"
    assert fmt(3.0) == "3" and fmt(7) == "7" and fmt(True) == "yes" and fmt(np.False_) == "no" and fmt("a b") == "a b"
    assert fmt(math.inf) == "∞"


def test_constant_columns_are_said_once_and_the_default_index_is_hidden():
    df = pd.DataFrame({"backbone": ["m"] * 4, "questions": [40] * 4, "config": list("abcd"),
                       "acc": [0.1234567, None, 0.5, 0.25]})
    assert constant_columns(df) == {"backbone": "m", "questions": "40"}
    out = frame_html(df)
    assert "In every row: backbone: <b>m</b> · questions: <b>40</b>" in out
    assert ">backbone<" not in out and ">questions<" not in out and ">config<" in out
    assert "0.123" in out and "0.1234567" not in out and ">—<" in out
    assert "nan" not in out.lower().replace("nan;", "")  # no nan cell
    assert "row_heading" not in out  # no index column


def test_long_frames_are_shown_whole_and_a_labelled_index_is_kept():
    long = pd.DataFrame({"i": range(300), "text": ["x" * 200] * 299 + ["end"]})
    out = frame_html(long)
    assert out.count("<tr") == 301 and "…" not in out and "x" * 200 in out and "rows ×" not in out
    two = pd.DataFrame({"a": [1, 1], "b": [2, 3], "c": [4, 5]}, index=pd.Index(["Base", "CTRLS"], name="row"))
    out = frame_html(two)
    assert "In every row: a: <b>1</b>" in out and "Base" in out and "CTRLS" in out
    assert "In every row" not in frame_html(two.iloc[:1])  # one row: nothing to factor out
    flat = pd.DataFrame({"a": [1, 1], "b": [2, 2], "c": [3, 3]})
    assert constant_columns(flat) == {"a": "1"}  # two columns stay


def test_percent_intervals_are_rounded_to_what_they_support():
    from ctrls.report.provenance import pct_ci

    assert pct_ci(0.725, 0.60, 0.85) == "72 [60, 85]"  # 25 points wide: whole points
    assert pct_ci(0.725, 0.701, 0.749) == "72.5 [70.1, 74.9]"
    assert pct_ci(0.5, 0.498, 0.502) == "50.00 [49.80, 50.20]"
    assert pct_ci(0.0, 0.0, 0.0) == "0.0 [0.0, 0.0]"


def test_a_note_on_the_frame_is_said_above_it():
    df = pd.DataFrame({"a": [1, 2]})
    df.attrs["note"] = "Every score was 5.5."
    assert frame_html(df).index("Every score was 5.5.") < frame_html(df).index("<table")


def test_an_all_equal_judge_table_is_one_sentence_beside_the_papers_scores():
    from ctrls.generate.judge import CRITERIA
    from ctrls.report.beside_paper import table3_vs_paper

    rows = [{"config": c, **{k: 5.5 for k in CRITERIA}, **{f"parse_{k}": "regex" for k in CRITERIA}}
            for c in ("Base", "ε=0.5, H=0") for _ in range(3)]
    t = table3_vs_paper(pd.DataFrame(rows), seed=0)
    assert "the same score, 5.5, on all 5 criteria" in t.attrs["note"], t.attrs
    assert not any("(ours)" in c and c != "n (ours)" for c in t.columns)
    assert {f"{k} (paper)" for k in ("S", "A", "C", "H", "Overall")} <= set(t.columns)  # shown alone, still labelled
    rows[0][CRITERIA[0]] = 7.0
    t = table3_vs_paper(pd.DataFrame(rows), seed=0)
    assert "note" not in t.attrs and any("(ours)" in c for c in t.columns)


def test_a_list_reads_as_words():
    from ctrls.report.display import and_list

    assert [and_list(x) for x in ([0], [0, 1], (0, 1, 2), [])] == ["0", "0 and 1", "0, 1 and 2", ""]


def test_a_p_value_column_prints_one_way():
    from ctrls.report.display import is_p_column

    assert all(map(is_p_column, ["p", "p (Holm)", "p (κ, Holm)", "Δκ p (Holm)", "p, minimal discordance", "p-value"]))
    assert not any(map(is_p_column, ["pass@1", "steps", "paper", "n (inferred)"]))
    out = frame_html(pd.DataFrame({"x": [1.5, 2.5], "p (Holm)": [1.52e-24, 0.0312]}))
    assert " ><1e-4</td>" in out and "0.031" in out and "e-24" not in out  # as format_p prints it in other tables
