"""The procedural word-problem dataset (ctrls.data.word_problems) and the demo's power calculation (ctrls.stats.sizing)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from ctrls.config.schema import load_config
from ctrls.data.answers import grade
from ctrls.data.problems import DataError, load_problems
from ctrls.data.word_problems import Difficulty, generate
from ctrls.errors import ConfigError
from ctrls.stages.common import problems_from_config
from ctrls.stats.sizing import beta_params, icc_from_rates, minimal_detectable, simulated_power

LEVELS = [Difficulty(), Difficulty(n_ops=3, max_value=50, ops=("add", "sub", "mul")), Difficulty(n_ops=2, ops=("sub",)),
          Difficulty(n_ops=1, ops=("mul",), wordings=1)]


def solve(question: str) -> int:
    """An independent reader of the story: the start, then each change, by its words."""
    m = re.match(r"\w+ has (\d+) bags with (\d+) \w+(?: \w+)? in each bag\.", question)
    x = int(m.group(1)) * int(m.group(2)) if m else int(re.match(r"\w+ has (\d+) ", question).group(1))
    for s in re.findall(r"Then ([^.]*)\.", question):
        k = int(re.search(r"\d+", s).group())
        if re.search(r"gets \d+ more|finds \d+ more|a friend gives \w+ \d+ more", s):
            x += k
        elif re.search(r"gives away|loses|gives \d+ .* to a friend", s):
            x -= k
        else:
            raise AssertionError(f"unknown change: {s!r}")
    return x


@pytest.mark.parametrize("d", LEVELS, ids=lambda d: d.tag())
def test_golds_and_reference_chains_are_right(d):
    for split in ("train", "test"):
        for p in load_problems("word_problems", split, n=150, seed=3, difficulty=d):
            assert int(p.answer) == solve(p.question) >= 1, p.question
            assert grade("\n".join(p.steps), p.answer).correct, p.steps  # every reference chain grades correct
            assert p.steps[-1] == f"The answer is {p.answer}." and len(p.steps) == d.n_ops + 2 - ("bags" in p.question)


def test_deterministic_nested_and_disjoint():
    a, b = generate("test", 120, seed=5), generate("test", 120, seed=5)
    assert a == b
    assert generate("test", 40, seed=5) == a[:40]  # a larger n extends a smaller one
    assert generate("test", 40, seed=6) != a[:40]
    train = {r["question"] for r in generate("train", 2000, seed=5)}
    test = {r["question"] for r in generate("test", 2000, seed=5)}
    assert len(train) == len(test) == 2000 and not train & test


def test_difficulty_knob_changes_the_problems():
    easy = generate("test", 200, difficulty=Difficulty(n_ops=1, max_value=10))
    hard = generate("test", 200, difficulty=Difficulty(n_ops=3, max_value=50))
    assert max(int(r["answer"]) for r in easy) <= 20 < max(int(r["answer"]) for r in hard)
    assert all(r["question"].count("Then") == 1 for r in easy) and all(r["question"].count("Then") == 3 for r in hard)
    one = generate("test", 200, difficulty=Difficulty(wordings=1, ops=("add",)))
    assert all("gets" in r["question"] for r in one)


def test_bad_difficulty_and_sizes_are_refused():
    with pytest.raises(ValueError, match="n_ops"):
        Difficulty(n_ops=0)
    with pytest.raises(ValueError, match="ops"):
        Difficulty(ops=("div",))
    with pytest.raises(DataError, match="at most 100000"):
        load_problems("word_problems", "test", n=10**18)
    with pytest.raises(DataError, match="can produce only 1536 distinct problems"):
        load_problems("word_problems", "test", n=5000, difficulty=Difficulty(max_value=2, ops=("add",), wordings=1))
    with pytest.raises(ConfigError, match="data.word_problems"):
        load_config("demo", ["data.word_problems.ops=[mul]", "data.word_problems.n_ops=2"])
    with pytest.raises(ConfigError, match="n_ops"):
        load_config("demo", ["data.word_problems.n_ops=0"])


# ---- the knobs do what they say --------------------------------------------


def changes(question: str) -> list[str]:
    """'add' or 'sub' for each change the story makes, by its words."""
    out = []
    for s in re.findall(r"Then ([^.]*)\.", question):
        out.append("add" if re.search(r"more", s) else "sub")
    return out


@pytest.mark.parametrize("d", [Difficulty(n_ops=3, max_value=4, ops=("sub",), wordings=1),
                               Difficulty(n_ops=3, max_value=5, ops=("sub", "mul")),
                               Difficulty(n_ops=8, max_value=9, ops=("sub",)),
                               Difficulty(n_ops=2, max_value=10, ops=("add",))], ids=lambda d: d.tag())
def test_a_problem_holds_only_the_operations_asked_for(d):
    """ops=('sub',) gave problems with additions (60 of 60 at n_ops=3, max_value=2)."""
    allowed = set(d.ops) - {"mul"}
    for split in ("train", "test"):
        for r in generate(split, 60, seed=1, difficulty=d):
            assert set(changes(r["question"])) <= allowed, r["question"]
            assert int(r["answer"]) == solve(r["question"]) >= 1, r["question"]
            assert grade("\n".join(r["steps"]), r["answer"]).correct


def test_a_subtraction_only_difficulty_without_room_is_refused():
    with pytest.raises(ValueError, match=r"need max_value >= 4"):
        Difficulty(n_ops=3, max_value=2, ops=("sub",), wordings=1)  # 2 cannot lose 1 three times and stay positive
    with pytest.raises(ConfigError, match="data.word_problems.*max_value >= 3"):
        load_config("demo", ["data.word_problems.ops=[sub]", "data.word_problems.n_ops=2", "data.word_problems.max_value=2"])


@pytest.mark.parametrize("key", ["n_ops", "wordings"])  # (max_value=True is 1: below its range anyway)
def test_a_boolean_is_not_an_integer(key):
    with pytest.raises(ValueError, match=f"{key} must be an integer.*True"):
        Difficulty(**{key: True})


def test_ops_from_a_list_are_a_tuple():
    d = Difficulty(ops=["add", "sub"])
    assert d.ops == ("add", "sub") and hash(d) == hash(Difficulty())
    with pytest.raises(ValueError, match="n_ops=1 only"):
        Difficulty(n_ops=2, ops=["mul"])  # a list compared as a tuple: not waved through
    with pytest.raises(ValueError, match="ops must be a list"):
        Difficulty(ops="add")


def every_question(d):
    """Every question a difficulty can produce, written out by brute force from its rules."""
    from ctrls.data.word_problems import NAMES, OBJECTS, _change_sentence, _question, _start_sentence

    starts = []
    if "mul" in d.ops:
        starts += [((a, b), a * b, d.n_ops - 1) for a in range(2, d.max_value + 1) for b in range(2, d.max_value + 1)
                   if "add" in d.ops or a * b >= d.n_ops]
    if set(d.ops) - {"mul"}:
        lo = 1 if "add" in d.ops else d.n_ops + 1
        starts += [((x,), x, d.n_ops) for x in range(lo, d.max_value + 1)]
    out = set()

    def walk(n, o, sentences, x, left):
        if not left:
            out.add(_question(n, o, sentences))
            return
        moves = [("add", b, x + b) for b in range(1, d.max_value + 1)] if "add" in d.ops else []
        if "sub" in d.ops and x > 1:
            most = d.max_value if x > d.max_value else x - 1
            if "add" not in d.ops:
                most = min(most, x - left)  # leave 1 for each later subtraction
            moves += [("sub", b, x - b) for b in range(1, most + 1)]
        for op, b, y in moves:
            for w in range(d.wordings):
                walk(n, o, sentences + [_change_sentence(n, o, op, w, b)], y, left - 1)

    for n in NAMES:
        for o in OBJECTS:
            for start, x, left in starts:
                walk(n, o, [_start_sentence(n, o, start)], x, left)
    return out


@pytest.mark.parametrize("d", [Difficulty(max_value=2, ops=("add",), wordings=1),
                               Difficulty(n_ops=3, max_value=4, ops=("sub",), wordings=1),
                               Difficulty(n_ops=2, max_value=3, ops=("sub", "mul"), wordings=1),
                               Difficulty(n_ops=2, max_value=2, ops=("add", "sub"), wordings=1)], ids=lambda d: d.tag())
def test_a_difficulty_can_give_every_problem_it_counts_and_not_one_more(d):
    """capacity() and split_size() count exactly what the generator can draw (checked against a brute
    force written from the rules; the generator's problems are among them), and one problem more
    than a split holds is refused at once, naming the size."""
    import time

    from ctrls.data.word_problems import capacity, split_size

    every = every_question(d)
    assert capacity(d) == len(every)
    n_test = split_size(d, "test")
    assert split_size(d, "train") + n_test == len(every)
    got = generate("test", n_test // 2, seed=2, difficulty=d)  # (all of them: the rarest take many draws)
    assert {r["question"] for r in got} <= every and len(got) == n_test // 2
    t0 = time.time()
    with pytest.raises(ValueError, match=f"holds {n_test} distinct test problems"):
        generate("test", n_test + 1, seed=2, difficulty=d)
    with pytest.raises(ValueError, match=f"can produce only {len(every)} distinct problems"):
        generate("train", len(every) + 1, seed=2, difficulty=d)
    assert time.time() - t0 < 5  # at once: counted, not drawn


def test_an_impossible_size_fails_at_once_at_any_size():
    import time

    from ctrls.data.word_problems import capacity, check_size

    d = Difficulty(n_ops=1, max_value=10, ops=("mul",), wordings=1)
    assert capacity(d) == 81 * 384
    t0 = time.time()
    with pytest.raises(ValueError, match="can produce only 31104 distinct problems"):
        generate("test", 100_000, difficulty=d)  # was: 2 million draws before an error
    assert time.time() - t0 < 5
    assert capacity(Difficulty(n_ops=8, max_value=10_000)) is None  # huge: not counted, and fast
    check_size(Difficulty(n_ops=8, max_value=10_000), "test", 100_000)


def test_config_reaches_the_loader():
    cfg = load_config("demo", ["data.dataset=word_problems", "data.word_problems.n_ops=2", "data.n_test=5"])
    ps = problems_from_config(cfg, "test")
    assert len(ps) == 5 and all(p.question.count("Then") == 2 for p in ps) and ps[0].source == "word_problems"


# ---- the power calculation -------------------------------------------------------------------


def test_beta_model_has_the_stated_mean_and_icc():
    a, b = beta_params(0.3, 0.2)
    assert a / (a + b) == pytest.approx(0.3) and 1 / (a + b + 1) == pytest.approx(0.2)
    rng = np.random.default_rng(0)
    rates = rng.binomial(8, rng.beta(a, b, 20_000)) / 8
    assert icc_from_rates(rates, 8) == pytest.approx(0.2, abs=0.02)


def test_paired_test_has_its_size_and_power_grows_with_n():
    assert simulated_power(0.25, 0.0, 40, 4, 0.3, n_sim=6000, seed=1) == pytest.approx(0.05, abs=0.012)
    p = [simulated_power(0.25, 0.1, n, 4, 0.3, n_sim=1500) for n in (16, 64, 256)]
    assert p[0] < p[1] < p[2] and p[2] > 0.99
    assert minimal_detectable(0.25, 200, 4, 0.3, n_sim=800) < minimal_detectable(0.25, 30, 4, 0.3, n_sim=800)
    assert np.isnan(minimal_detectable(0.95, 5, 1, 0.3, n_sim=200))  # no detectable rise below 100%


def test_transfer_datasets_are_checked_at_load():
    cfg = load_config("demo")
    assert cfg.grid.transfer_datasets == ["gsm8k"] and cfg.data.dataset == "word_problems"
    with pytest.raises(ConfigError, match="grid.transfer_datasets"):
        load_config("demo", ["grid.transfer_datasets=[word_problems]"])  # the pair's own dataset
    with pytest.raises(ConfigError, match="grid.transfer_datasets"):
        load_config("demo", ["grid.datasets=[word_problems, gsm8k]", "grid.transfer_datasets=[math]"])
