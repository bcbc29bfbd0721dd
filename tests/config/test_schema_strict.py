"""A key given twice (in a profile, an override's YAML or the override list) is
refused naming it; -0.0 and 0.0 are one epsilon; a word-problem size its split cannot give, a seed torch
cannot take and two dataset names that share a directory are refused when the config loads."""
import time

import pytest

from ctrls.config.overrides import parse_overrides
from ctrls.config.schema import ConfigError, load_config


def _profile(tmp_path, text):
    p = tmp_path / "mine.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text,key", [
    ("seed: 5\nseed: 6\n", "seed"),
    ("data: {n_test: 5, n_test: 6}\n", "n_test"),
    ("data:\n  n_train: 4\n  n_train: 8\n", "n_train"),
    ("grid: {epsilons: [0.1]}\ngrid: {n_samples: 2}\n", "grid"),
    ("seed: 1\ndata: {seed: 2}\n'seed': 3\n", "seed"),
])
def test_a_key_given_twice_in_a_profile_is_refused_naming_it(tmp_path, text, key):
    with pytest.raises(ConfigError, match=rf"'{key}' is given twice"):
        load_config(_profile(tmp_path, text))


def test_a_dotted_key_and_its_section_in_one_profile_are_the_key_twice(tmp_path):
    with pytest.raises(ConfigError, match=r"'data\.n_test' is given twice"):
        load_config(_profile(tmp_path, "data: {n_test: 5}\ndata.n_test: 6\n"))


def test_a_merge_key_may_be_overridden(tmp_path):
    cfg = load_config(_profile(tmp_path, "data: {<<: {n_test: 5, n_train: 4}, n_test: 6}\n"))
    assert cfg.data.n_test == 6 and cfg.data.n_train == 4  # YAML's merge: the mapping's own key wins, no error


@pytest.mark.parametrize("items,key", [
    (["seed=5", "seed=6"], "seed"),
    ("seed=5 data.n_test=3 seed=6", "seed"),
    (["data={n_test: 5, n_test: 6}"], "n_test"),
    (["data.n_test=5", "data={n_test: 6}"], "data.n_test"),
])
def test_a_key_given_twice_in_the_overrides_is_refused_naming_it(items, key):
    with pytest.raises(ConfigError, match=rf"'{key}' is given twice"):
        load_config("smoke", items)
    if isinstance(items, list) and len(items) == 1:
        with pytest.raises(ConfigError, match=rf"'{key}' is given twice"):
            parse_overrides(items)


@pytest.mark.parametrize("items,key", [
    (["grid.epsilons=[-0.0, 0.0]"], "grid.epsilons"),
    (["grid.epsilons=[0.0, -0.0, 0.1]"], "grid.epsilons"),
    (["rl.table2=['eps=-0', 'eps=0']"], "rl.table2"),
    (["judge.settings=['eps=0.1,H=-0.0', 'eps=0.1,H=0']"], "judge.settings"),
    (["synthetic.epsilons=[-0.0, 0.0]"], "synthetic.epsilons"),
])
def test_minus_zero_and_zero_are_one_value(items, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("smoke", items)


@pytest.mark.parametrize("key", ["seed", "data.seed", "rl.seeds", "synthetic.seeds"])
def test_every_seed_is_bounded_to_what_torch_takes(key):
    value = 2**64
    item = f"{key}=[0, {value}]" if key.endswith("seeds") else f"{key}={value}"
    with pytest.raises(ConfigError, match=rf"'{key}(\[1\])?': {value} is not allowed; allowed: .*2\*\*63 - 1"):
        load_config("smoke", [item])
    big = 2**63 - 1  # the largest a seed may be: torch takes < 2**64, and stages add small offsets
    ok = load_config("smoke", [f"{key}=[{big}]" if key.endswith("seeds") else f"{key}={big}"])
    assert ok is not None


def test_a_word_problem_size_its_split_cannot_hold_is_refused_at_load():
    base = ["data.dataset=word_problems", "grid.datasets=[word_problems]", "grid.transfer_datasets=[]",
            "data.word_problems.n_ops=1", "data.word_problems.max_value=2", "data.word_problems.ops=[add]",
            "data.word_problems.wordings=1"]
    t0 = time.time()
    for key in ("data.n_test", "data.n_train", "rl.n_test"):
        with pytest.raises(ConfigError, match=rf"config key '{key}': .*difficulty ops1-max2-add-w1"):
            load_config("demo", [*base, f"{key}=800"])  # 1536 in all, 771 test and 765 train
    assert time.time() - t0 < 10
    assert load_config("demo", [*base, "data.n_test=100"]).data.n_test == 100


def test_a_transfer_size_its_split_cannot_hold_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"config key 'grid\.transfer_questions'"):
        load_config("smoke", ["grid.transfer_datasets=[word_problems]", "grid.transfer_questions=1000",
                              "data.word_problems.max_value=2", "data.word_problems.ops=[add]", "data.word_problems.wordings=1"])


def dataset_dir(d):
    """A JSONL dataset folder at ``d`` with one train and one test question."""
    d.mkdir(parents=True)
    for split in ("train", "test"):
        (d / f"{split}.jsonl").write_text('{"question": "1+1?", "answer": 2}\n')
    return d


def test_two_transfer_datasets_sharing_one_directory_are_refused(tmp_path):
    a, b = dataset_dir(tmp_path / "one" / "d"), dataset_dir(tmp_path / "two" / "d")  # both runs/.../<pair>__d-from-...
    with pytest.raises(ConfigError, match=r"grid\.transfer_datasets\[1\].*both would write"):
        load_config("smoke", [f"grid.transfer_datasets=[{a}, {b}]"])


def test_two_pairs_sharing_one_directory_name_across_the_separator_are_refused(tmp_path):
    a, b = dataset_dir(tmp_path / "x__y"), dataset_dir(tmp_path / "y")
    # "m" with "x__y" and "m__x" with "y" would both write runs/<profile>/<stage>/m__x__y
    with pytest.raises(ConfigError, match=r"both would write to runs/<profile>/<stage>/m__x__y"):
        load_config("smoke", [f"grid.datasets=[{a}, {b}]", "grid.backbones=[m, m__x]", "backbone.name=m",
                              f"data.dataset={a}", "rl.n_test=1", "data.n_test=1", "data.n_train=1",
                              "grid.transfer_datasets=[]"])
