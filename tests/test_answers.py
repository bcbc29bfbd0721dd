"""Answer extraction, verification against the gold answer, and grading."""
import json
import threading

import math_verify
import pytest

from ctrls.answers import extract_answer, grade, last_boxed, normalize, reference_verify_report, verify


@pytest.mark.parametrize("text,ans", [
    ("We add.\n#### 42", "42"),
    ("first #### 1\nthen #### 2", "2"),  # last #### wins
    ("#### 1,234.", "1,234"),
    ("The answer is $12$ and #### 13", "13"),  # #### beats the other forms
    ("So 3 + 4 = 7.\nThe answer is 7.", "7"),
    ("The final answer is: $12$.", "12"),
    ("THE ANSWER IS 3.5.", "3.5"),
    ("The answer is 18. I hope this helps!", "18"),  # first sentence only
    ("The answer is **7**.", "7"),
    ("The answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # boxed wrapper removed
    ("The answer is $\\boxed{42}$.", "42"),
    ("So the answer is 5. Wait, the answer is 6.", "6"),  # last wins on one line too
    ("The answer is 5 dollars.\nWait, the answer is 6.", "6"),
    ("Thus \\boxed{3} or rather \\boxed{\\sqrt{x^{2}}}", "\\sqrt{x^{2}}"),  # last boxed, nested braces
    ("\\boxed{\\frac{a}{b}}", "\\frac{a}{b}"),
    ("We might say the answer is $6\\times 3$. But halving gives $\\boxed{9}$.", "9"),  # the later form wins
    ("It is $\\boxed{4}$. The answer is 5.", "5"),
])
def test_extract(text, ans):
    assert extract_answer(text) == ans


@pytest.mark.parametrize("text", ["", "I do not know.", "answer: maybe", "\\boxed{unclosed", "\\boxed{}",
                                  "The answer is.", "The answer is $$."])
def test_no_answer(text):
    assert extract_answer(text) is None
    g = grade(text, "3")
    assert not g.valid and not g.correct and g.pred is None


def test_last_boxed_matches_braces():
    assert last_boxed("x \\boxed{a{b}c} y \\fbox{d}") == "d"
    assert last_boxed("\\boxed{\\frac{a}{b}} tail") == "\\frac{a}{b}"
    assert last_boxed("no box") is None and last_boxed("\\boxed{a{b}") is None


@pytest.mark.parametrize("raw,norm", [
    ("1,000", "1000"), ("-12,345.5", "-12345.5"), ("(1,2)", "(1,2)"), ("1,0000", "1,0000"), ("18 dollars", "18"),
    ("12 \\text{ inches}", "12"), ("\\$18.00", "18"), ("x = 5", "5"), ("42 (6 times 7)", "42"),
    ("7 and 8", "7 and 8"), ("3 pi", "3 pi"), ("5 (x+1)", "5 (x+1)"), ("\\text{(C)}", "(C)"), ("10,\\!000", "10000"),
])
def test_normalize(raw, norm):
    assert normalize(raw) == norm


@pytest.mark.parametrize("gold,pred,ok", [
    ("0.5", "\\frac{1}{2}", True), ("\\frac{1}{2}", "0.5", True), ("1000", "1,000", True), ("1,000", "1000", True),
    ("18", "18 dollars", True), ("12", "12 cookies per box", True), ("5", "x = 5", True),
    ("\\frac{14}{3}", "\\dfrac{14}{3}", True), ("(1,2)", "(1, 2)", True), ("10\\%", "10", True),
    ("\\frac{7}{5} + \\frac{1}{5} i.", "\\frac{7}{5}+\\frac{1}{5}i", True), ("x^2+1", "1+x^2", True),
    ("3", "4", False), ("1000", "1,0000", False), ("\\sqrt{2}", "1.41", False), ("(1,2)", "12", False),
    ("7", "7 and 8", False), ("3", "3 pi", False), ("5", "5x", False), ("8", "18", False), ("5", None, False),
])
def test_verify(gold, pred, ok):
    assert verify(gold, pred) is ok


def test_verify_passes_the_gold_first(monkeypatch):
    calls = []

    def recording_verify(gold, target, **kwargs):
        calls.append((gold, target))
        return False

    monkeypatch.setattr(math_verify, "verify", recording_verify)
    assert verify("3", "4") is False
    (g, t), = calls
    assert (g[0], t[0]) == (3, 4)  # parsed gold first, parsed prediction second


def test_verify_from_another_thread():
    out = []  # SIGALRM timeouts work only in the main thread: verify must still give the right answer
    t = threading.Thread(target=lambda: out.append(verify("0.5", "\\frac{1}{2}")))
    t.start()
    t.join()
    assert out == [True]


def test_verify_rejects_an_empty_gold():
    with pytest.raises(ValueError, match="gold"):
        verify("", "3")


def test_grade_flags():
    g = grade("2 + 2 = 4\nThe answer is 5.", "4")
    assert g.valid and not g.correct and g.pred == "5"
    assert grade("The answer is 4.", "4").correct


def test_reference_verify_report_lists_failures(tmp_path):
    rows = [{"problem": "What is $1+1$?", "solution": "Clearly $\\boxed{2}$.", "answer": "2", "unique_id": "a"},
            {"problem": "What is $2+2$?", "solution": "Clearly $\\boxed{5}$.", "answer": "4", "unique_id": "b"}]
    (tmp_path / "math").mkdir()
    (tmp_path / "math" / "math500_test.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    rep = reference_verify_report("math", "test", data_dir=str(tmp_path))
    assert rep["n"] == 2 and rep["rate"] == 0.5
    assert rep["failures"] == [{"id": "math-b", "gold": "4", "extracted": "5"}]
