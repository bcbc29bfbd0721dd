"""The setup page's word problems keep their dollar signs ("The TV costs $600", not "costs600"),
MATH's TeX still reads as plain text, and the page names no build path."""
from __future__ import annotations

from ctrls.config.schema import load_config
from ctrls.report import setup_check


def test_dollar_amounts_are_kept_and_tex_is_plain():
    q = ("Mustafa buys a fridge, a TV and a computer with a total budget of $1600. The TV costs $600 and the fridge "
         "costs $500 more than the computer.")
    assert setup_check.plain_tex(q) == q
    q = "Carmen has $100, Samantha has $25 more than Carmen, and Daisy has $50 more than Samantha."
    assert setup_check.plain_tex(q) == q
    assert setup_check.plain_tex("What is $12$ times $k$?") == "What is 12 times k?"
    assert setup_check.plain_tex(r"Find $\frac{1}{2}$ of $x^2 + 1$.") == "Find 1/2 of x² + 1."


def test_the_data_source_is_words_not_a_path():
    assert setup_check.data_source(load_config("demo")) in ("a local data directory", "the Hugging Face hub")
