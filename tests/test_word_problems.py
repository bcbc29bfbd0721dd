"""The procedural word-problem dataset (ctrls.word_problems) and the demo's power calculation (ctrls.sizing)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from ctrls.answers import grade
from ctrls.config import load_config
from ctrls.data import DataError, load_problems, problems_from_config
from ctrls.overrides import ConfigError
from ctrls.sizing import beta_params, icc_from_rates, minimal_detectable, simulated_power
from ctrls.word_problems import Difficulty, generate

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
    with pytest.raises(DataError, match="fewer than"):
        load_problems("word_problems", "test", n=5000, difficulty=Difficulty(max_value=2, ops=("add",), wordings=1))
    with pytest.raises(ConfigError, match="data.word_problems"):
        load_config("demo", ["data.word_problems.ops=[mul]", "data.word_problems.n_ops=2"])
    with pytest.raises(ConfigError, match="n_ops"):
        load_config("demo", ["data.word_problems.n_ops=0"])


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
