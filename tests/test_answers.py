import pytest

from ctrls.answers import extract_answer, grade, last_boxed, verify


@pytest.mark.parametrize("text,ans", [
    ("We add.\n#### 42", "42"),
    ("first #### 1\nthen #### 2", "2"),
    ("So 3 + 4 = 7.\nThe answer is 7.", "7"),
    ("The final answer is: $12$.", "12"),
    ("The answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("Thus \\boxed{3} or rather \\boxed{\\sqrt{x^{2}}}", "\\sqrt{x^{2}}"),
    ("The answer is 5 dollars.\nWait, the answer is 6.", "6"),
])
def test_extract(text, ans):
    assert extract_answer(text) == ans


@pytest.mark.parametrize("text", ["", "I do not know.", "answer: maybe", "\\boxed{unclosed"])
def test_no_answer(text):
    assert extract_answer(text) is None
    g = grade(text, "3")
    assert not g.valid and not g.correct and g.pred is None


def test_last_boxed_matches_braces():
    assert last_boxed("x \\boxed{a{b}c} y \\fbox{d}") == "d"
    assert last_boxed("\\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"


@pytest.mark.parametrize("gold,pred,ok", [
    ("0.5", "\\frac{1}{2}", True), ("1000", "1,000", True), ("18", "18 dollars", True), ("5", "x = 5", True),
    ("\\frac{14}{3}", "\\dfrac{14}{3}", True), ("(1,2)", "(1, 2)", True), ("3", "4", False),
    ("1000", "1,0000", False), ("\\sqrt{2}", "1.41", False),
])
def test_verify(gold, pred, ok):
    assert verify(gold, pred) is ok


def test_grade_flags():
    g = grade("2 + 2 = 4\nThe answer is 5.", "4")
    assert g.valid and not g.correct and g.pred == "5"
    assert grade("The answer is 4.", "4").correct
