"""A scale named between a criterion and its score ("overall 10-point scale: 3")
is the score's scale, never the score."""
import pytest

from ctrls.generate.judge import CRITERIA, DEFAULT_SCORE, parse_scores


def _score(reply, key="overall"):
    p = parse_scores(reply)
    return p.scores[key], p.per_key[key]


@pytest.mark.parametrize("reply,expect", [
    ("overall 10-point scale: 3", 3.0),
    ("Overall (10-point scale): 3", 3.0),
    ("Overall, on a 10-point scale: 3", 3.0),
    ("overall (1-10 scale): 7", 7.0),
    ("overall 1-10 scale: 7", 7.0),
    ("overall (scale of 1 to 5): 4", 8.0),  # the scale named before the score, as a fraction of 10
    ("overall 5-point scale: 2", 4.0),
])
def test_a_scale_between_the_criterion_and_its_score_is_its_scale(reply, expect):
    assert _score(reply) == (expect, "regex")


def test_each_criterion_reads_its_own_named_scale():
    p = parse_scores("overall 10-point scale: 3\nalgebra 5-point scale: 4")
    assert p.scores["overall"] == 3.0 and p.scores["algebra"] == 8.0
    others = [k for k in CRITERIA if k not in ("overall", "algebra")]
    assert all(p.scores[k] == DEFAULT_SCORE for k in others)  # two scales for the reply: the rest unreadable


def test_a_bare_scale_with_no_score_is_no_score():
    assert _score("overall 10-point scale.") == (DEFAULT_SCORE, "default")
