"""ctrls.config.settings: the RL settings grammar (named curves, ``eps=X``/``H=Y`` with their aliases, a key
given twice refused), the labels the tables print (``ε=…, H=…``, ``eps=…``, ``state k``) written out by
hand, and which (backbone, dataset) pair Table 3 scores."""
from types import SimpleNamespace

import pytest

from ctrls.config.schema import load_config
from ctrls.config.settings import (
    BASE,
    Setting,
    constant_label,
    format_number,
    judge_pair,
    parse_setting,
    row_label,
    setting_label,
)


def test_settings():
    cfg = load_config("smoke", ["rl.epsilon=0.2", "rl.entropy_coef=0.05"])
    assert parse_setting("both", cfg) == Setting("both", 0.2, 0.05)
    assert parse_setting("eps=0.3", cfg) == Setting("eps=0.3", 0.3, 0.0)
    assert parse_setting("H=0.01", cfg) == Setting("H=0.01", 0.0, 0.01)
    with pytest.raises(ValueError, match="unknown RL setting"):
        parse_setting("greedy", cfg)


def test_the_judge_pair_is_named_or_the_only_one():
    from ctrls.config.settings import judge_pair

    assert judge_pair(load_config("demo")) == ("smollm2-135m-instruct", "word_problems")
    two = load_config("demo", ["grid.datasets=[gsm8k, math]", "grid.transfer_datasets=[]"])
    with pytest.raises(ValueError, match="judge.pair is not set"):
        judge_pair(two)
    assert judge_pair(load_config("demo", ["grid.datasets=[gsm8k, math]", "grid.transfer_datasets=[]",
                                           "judge.pair=[smollm2-135m-instruct, math]"])) == \
        ("smollm2-135m-instruct", "math")
    from ctrls.config.schema import ConfigError
    with pytest.raises(ConfigError, match="judge.pair"):  # refused when the config loads, before any stage
        load_config("demo", ["judge.pair=[smollm2-135m-instruct, math]"])


@pytest.mark.parametrize("name", ["eps=0.1,eps=0.2", "eps=0.1,epsilon=0.1", "H=0.01,alpha=0.02",
                                  "eps=0.1,H=0.01,H=0.02"])
def test_a_setting_with_a_repeated_key_is_refused(name):
    cfg = load_config("smoke")
    with pytest.raises(ValueError, match="twice"):
        parse_setting(name, cfg)
    assert parse_setting("eps=0.1,H=0.01", cfg).epsilon == 0.1


@pytest.mark.parametrize("x,text", [(0.0, "0.0"), (0.1, "0.1"), (0.01, "0.01"), (0.3, "0.3"), (0.25, "0.25"),
                                    (1.0, "1.0"), (2.0, "2.0"), (0.001, "0.001"), (1e-05, "1e-05")])
def test_numbers_are_written_as_the_paper_writes_them(x, text):
    assert format_number(x) == text


def test_the_labels_of_rows_policies_and_constant_states():
    assert setting_label(0.0, 0.0) == "ε=0.0, H=0.0"
    assert setting_label(0.3, 0.01) == "ε=0.3, H=0.01"
    assert setting_label(0.25, 0.001) == "ε=0.25, H=0.001"
    assert Setting("mine", 0.1, 0.01).label == "ε=0.1, H=0.01"
    assert row_label(None) == BASE == "Base"
    assert row_label(0.1) == "eps=0.1" and row_label(0.0) == "eps=0" and row_label(1.0) == "eps=1"
    assert [constant_label(s) for s in range(3)] == ["state 1", "state 2", "state 3"]


def test_named_settings_read_the_configs_epsilon_and_entropy_and_aliases_spell_the_same_setting():
    cfg = SimpleNamespace(rl=SimpleNamespace(epsilon=0.4, entropy_coef=0.02))
    assert parse_setting("none", cfg) == Setting("none", 0.0, 0.0)
    assert parse_setting("epsilon", cfg) == Setting("epsilon", 0.4, 0.0)
    assert parse_setting("entropy", cfg) == Setting("entropy", 0.0, 0.02)
    s = parse_setting("epsilon=0.1,alpha=0.01", cfg)
    assert (s.epsilon, s.alpha, s.label) == (0.1, 0.01, "ε=0.1, H=0.01")
    s = parse_setting(" eps = 0.2 , H = 0.03 ", cfg)  # keys and values may be padded
    assert (s.epsilon, s.alpha) == (0.2, 0.03)
    for bad in ("eps=x", "gamma=0.1", "eps", "eps=0.1;H=0.01"):
        with pytest.raises(ValueError, match=f"unknown RL setting '{bad}'"):
            parse_setting(bad, cfg)


def _pairs_cfg(pairs, pair):
    return SimpleNamespace(pairs=lambda: list(pairs), judge=SimpleNamespace(pair=pair))


def test_the_judge_pair_must_be_two_names_of_one_of_the_profiles_pairs():
    pairs = [("m", "gsm8k"), ("m", "math")]
    assert judge_pair(_pairs_cfg(pairs, ["m", "math"])) == ("m", "math")
    assert judge_pair(_pairs_cfg(pairs[:1], None)) == ("m", "gsm8k")
    with pytest.raises(ValueError, match=r"judge.pair must be \[backbone, dataset\], got \['m'\]"):
        judge_pair(_pairs_cfg(pairs, ["m"]))
    with pytest.raises(ValueError, match=r"judge.pair \['m', 'gsm_symbolic'\] is not one of the profile's pairs"):
        judge_pair(_pairs_cfg(pairs, ["m", "gsm_symbolic"]))
    with pytest.raises(ValueError, match=r"judge.pair is not set and the profile has 2 .* -o 'judge.pair=\[m, gsm8k\]'"):
        judge_pair(_pairs_cfg(pairs, None))
