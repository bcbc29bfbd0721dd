"""A subtraction-only difficulty's rarest problems are drawn so seldom that a
split size it holds could still run out of draws after many seconds; such a size is refused at once
(``producible``: what the generator finds within its draw budget, computed from the draw probabilities),
and any size it accepts is drawn."""
import time

import pytest

from ctrls.data.word_problems import Difficulty, check_size, generate, producible, split_size

SUB = [Difficulty(n_ops=2, max_value=4, ops=("sub",), wordings=1),
       Difficulty(n_ops=2, max_value=3, ops=("sub", "mul"), wordings=1)]


@pytest.mark.parametrize("d", SUB, ids=lambda d: d.tag())
def test_a_split_size_the_draws_cannot_reach_is_refused_at_once(d):
    have, most = split_size(d, "test"), producible(d, "test")
    assert most < have  # the split holds them, but its rarest are drawn too seldom to be found
    t0 = time.time()
    for ask in (lambda: check_size(d, "test", have), lambda: generate("test", have, seed=0, difficulty=d)):
        with pytest.raises(ValueError, match=f"drawn so seldom.*ask for at most {most}"):
            ask()
    assert time.time() - t0 < 2  # computed, not drawn (it took 4 to 7 s of draws before failing)


def test_half_of_a_skewed_split_can_be_out_of_reach_and_is_refused_at_once():
    d = Difficulty(n_ops=6, max_value=10, ops=("sub",), wordings=1)
    n = split_size(d, "test") // 2
    t0 = time.time()
    with pytest.raises(ValueError, match="drawn so seldom"):
        check_size(d, "test", n)
    assert time.time() - t0 < 5


def test_a_size_that_is_accepted_is_drawn():
    d = SUB[0]
    most = producible(d, "test")
    got = generate("test", most, seed=3, difficulty=d)
    assert len(got) == most == len({r["question"] for r in got})


def test_an_easy_difficulty_can_give_its_whole_split_budget_or_huge_is_unbounded():
    assert producible(Difficulty(n_ops=8, max_value=10_000), "test") is None  # uncounted: only MAX_PROBLEMS bounds it
    d = Difficulty()  # the demo's: its sizes are far below what the draws reach
    assert producible(d, "test") > 0.99 * split_size(d, "test")


@pytest.mark.parametrize("d", [*SUB, Difficulty(max_value=3, wordings=2),
                               Difficulty(n_ops=2, max_value=3, ops=("add", "sub", "mul"))],
                         ids=lambda d: d.tag())
def test_the_draw_probabilities_cover_every_counted_problem_once(d):
    from ctrls.data.word_problems import NAMES, OBJECTS, _sequence_probs, capacity

    p, m = _sequence_probs(d)
    assert (p * m).sum() == pytest.approx(1.0) and int(m.sum()) * len(NAMES) * len(OBJECTS) == capacity(d)
