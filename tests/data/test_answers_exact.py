"""Scaled numbers are exact at any size the checker scales ("50 factorial" is
not rounded to 28 significant digits), and Unicode vulgar fractions are numbers (½, ¾, 1⅓)."""
import math

import pytest

from ctrls.data.answers import grade, normalize, verify


@pytest.mark.parametrize("pred,gold", [
    ("50 factorial", str(math.factorial(50))),
    ("100 factorial", str(math.factorial(100))),
    ("123456789012345678901234567890123 thousand", "123456789012345678901234567890123000"),
    ("12345678901234567890123456789 squared", str(12345678901234567890123456789 ** 2)),
    ("1.234567890123456789012345678901e5", "123456.7890123456789012345678901"),
])
def test_scaled_numbers_are_exact(pred, gold):
    assert normalize(pred) == gold
    assert verify(gold, pred) and verify(pred, gold)


def test_a_scaled_number_one_off_is_wrong():
    assert not verify(str(math.factorial(50) + 1), "50 factorial")
    assert not verify(str(math.factorial(50) + 10**20), "50 factorial")


@pytest.mark.parametrize("pred,gold", [
    ("½", "1/2"), ("½", "0.5"), ("¾", "3/4"), ("¾", "0.75"), ("1⅓", "4/3"), ("2½", "2.5"), ("-1½", "-3/2"),
    ("⅞", "\\frac{7}{8}"), ("⅒", "0.1"), ("3 ¼", "13/4"), ("1⁄2", "1/2"),
])
def test_vulgar_fractions_are_numbers(pred, gold):
    assert verify(gold, pred) and verify(pred, gold)


@pytest.mark.parametrize("pred,gold", [("½", "2"), ("1⅓", "1/3"), ("¾", "0.7"), ("2½", "2")])
def test_vulgar_fractions_are_not_other_numbers(pred, gold):
    assert not verify(gold, pred)


def test_a_vulgar_fraction_graded_in_a_sentence():
    g = grade("Half of 3 is 1.5.\nThe answer is 1½.", "3/2")
    assert g.valid and g.correct
    assert grade("#### 2½", "5/2").correct and not grade("#### 2½", "2").correct
