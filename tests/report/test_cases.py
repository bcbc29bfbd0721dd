"""How a case study is shown (ctrls.report.cases.trace_html): TeX typeset, answers normalised, steps not
renumbered, the state label explained."""
import pandas as pd

from ctrls.report.cases import shown_answer, tex_html, trace_html


def row(**kw):
    base = {"steps": ["1. Add 3 and 4.", "The answer is 7."], "states": [2, 5], "pred": "7", "correct": True,
            "valid": True, "config": "eps=0.1"}
    return pd.Series({**base, **kw})


def test_tex_is_typeset_and_dollar_amounts_are_not():
    assert tex_html("If $a_4/a_2 = 3$, find $\\sqrt{x}$.") == "If \\(a_4/a_2 = 3\\), find \\(\\sqrt{x}\\)."
    assert tex_html("She pays $5 and $10 < $20.") == "She pays $5 and $10 &lt; $20."
    assert tex_html("For how many $x$ is it real?") == "For how many \\(x\\) is it real?"


def test_the_answer_is_normalised_or_says_there_is_none():
    assert shown_answer(row(pred=float("nan"))) == "no answer" and shown_answer(row(pred=None)) == "no answer"
    assert shown_answer(row(pred="18 dollars.")) == "18"


def test_trace_keeps_the_models_numbering_and_explains_states():
    out = trace_html("Q with $x^2$", "7", row(pred=float("nan"), correct=False, valid=False), row())
    assert "<ol" not in out and "1. Add 3 and 4." in out  # one numbering: the model's own
    assert "s = 5" in out and "latent state" in out
    assert "answer <code>no answer</code>" in out and "nan" not in out
    assert "\\(x^2\\)" in out and "mathjax_process" in out


def test_the_state_legend_is_shown_once_per_page_not_per_case():
    from ctrls.report.cases import STATE_NOTE, state_note_html

    with_note = trace_html("Q", "7", row(), row())
    without = trace_html("Q", "7", row(), row(), note=False)
    assert STATE_NOTE in with_note and STATE_NOTE not in without and STATE_NOTE in state_note_html()
    assert "s = 5" in without  # the badges stay; only the legend goes
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / "05_case_studies.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert code.count("state_note_html()") == 1 and code.count("trace_html(") == code.count("note=False")
