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


def _samples():
    """Two questions: Base always wrong; on q1 the fixed-s0 row and an eps row whose state never moves are
    correct, and a later eps sample whose state changes is correct too; on q2 only a still eps sample is."""
    rows = []

    def add(q, config, i, correct, states, eps):
        rows.append({"backbone": "b", "temperature": 0.7, "question_id": q, "config": config, "sample_index": i,
                     "correct": correct, "valid": True, "states": states, "epsilon": eps, "steps": ["x"] * len(states)})
    for q in ("q1", "q2"):
        add(q, "Base", 0, False, [], float("nan"))
        add(q, "fixed s0", 0, True, [2, 2, 2], float("nan"))
    add("q1", "eps=0.1", 0, True, [1, 1, 1], 0.1)
    add("q1", "eps=0.1", 1, True, [1, 3, 0], 0.1)
    add("q2", "eps=0.1", 0, True, [0, 0], 0.1)
    return pd.DataFrame(rows)


def test_cases_show_a_ctrls_sample_whose_state_changes_never_the_fixed_s0_row():
    from ctrls.report.cases import RULES, select_cases

    pairs, rule = select_cases(_samples(), n=3)
    assert rule == RULES[0] and list(pairs.question_id) == ["q1"]
    c = pairs.ctrls.iloc[0]
    assert c.config == "eps=0.1" and list(c.states) == [1, 3, 0]
    s = _samples()
    s = s[~((s.question_id == "q1") & (s.sample_index == 1) & (s.config == "eps=0.1"))]
    pairs, rule = select_cases(s, n=3)  # no moving correct sample: the rule relaxes, and says so
    assert rule == RULES[1] and list(pairs.question_id) == ["q1", "q2"]
    assert set(pairs.ctrls.map(lambda r: r.config)) == {"eps=0.1"}
