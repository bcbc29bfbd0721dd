"""ctrls.config.checks: each value's type (int taken as float, nothing else coerced) and declared rule, and the
checks across keys, refuse a bad config with a ConfigError naming the dotted key, the value and what is
allowed; a value set in code after loading is caught too, and every check across keys is registered."""
import inspect
from typing import Literal, Optional

import pytest

from ctrls.config import checks
from ctrls.config.checks import CROSS_CHECKS, MAX_SEED, check_type, refuse, validate
from ctrls.config.schema import ConfigError, load_config
from tests.config.test_schema_strict import dataset_dir


def test_cross_key_checks():
    with pytest.raises(ConfigError, match=r"'rl\.group_size': 1 is not allowed; allowed: >= 2 with rl\.baseline=group_mean"):
        load_config("smoke", ["rl.baseline=group_mean", "rl.group_size=1"])
    assert load_config("smoke", ["rl.baseline=group_mean", "rl.group_size=2"]).rl.group_size == 2
    # rl.temperature follows grid.temperatures when both change
    assert load_config("smoke", ["grid.temperatures=[0.3]", "rl.temperature=0.3"]).rl.temperature == 0.3
    # n_train is bounded per dataset of the grid, not by data.dataset alone
    with pytest.raises(ConfigError, match=r"'data\.n_train': 4501 is not allowed; allowed: 1 to 4500 for dataset 'math'"):
        load_config("smoke", ["grid.datasets=[gsm8k, math]", "data.n_train=4501"])
    # allowed, and documented: more evaluation questions than data.n_test evaluates all n_test
    assert load_config("smoke", ["rl.eval_questions=500"]).rl.eval_questions == 500


@pytest.mark.parametrize("key", ["data.n_test", "data.n_train", "rl.n_test"])
def test_a_generated_dataset_size_is_bounded_at_load(key):
    with pytest.raises(ConfigError, match=rf"config key '{key}': 1000000000000000000 is not allowed; allowed: 1 to 100000 "
                                          r"for the generated dataset 'gsm_symbolic'"):
        load_config("smoke", ["data.dataset=gsm_symbolic", "grid.datasets=[gsm_symbolic]", f"{key}={10**18}"])


def test_two_pairs_sharing_one_run_directory_are_refused(tmp_path):
    d = dataset_dir(tmp_path / "d")
    other = dataset_dir(tmp_path / "elsewhere" / "d")
    for datasets in ([str(d), f"{d}/"], [str(d), str(other)]):
        with pytest.raises(ConfigError, match=r"grid.datasets\[1\].*both would write to runs/<profile>/<stage>/d"):
            load_config("smoke", [f"data.dataset={d}", f"grid.datasets=[{', '.join(datasets)}]"])
    b1, b2 = tmp_path / "run1" / "checkpoint-500", tmp_path / "run2" / "checkpoint-500"
    b1.mkdir(parents=True)
    b2.mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"grid.backbones\[1\]"):
        load_config("smoke", [f"grid.backbones=[{b1}, {b2}]", f"backbone.name={b1}"])
    with pytest.raises(ConfigError, match=r"grid.backbones\[1\]"):
        load_config("smoke", ["grid.backbones=[org/model, org_model]", "backbone.name=org/model"])


def test_settings_that_would_share_a_row_are_refused():
    with pytest.raises(ConfigError, match="grid.epsilons"):
        load_config("smoke", ["grid.epsilons=[0.1234567, 0.1234568]"])
    with pytest.raises(ConfigError, match="rl.table2"):
        load_config("smoke", ["rl.table2=['eps=0.1', 'epsilon=0.1']"])


def test_refuse_says_key_value_allowed_and_why_in_one_line():
    assert str(refuse("a.b", 3, ">= 5", "a reason")) == "config key 'a.b': 3 is not allowed; allowed: >= 5 (a reason)"
    assert str(refuse("a.b", "x", "a number")) == "config key 'a.b': 'x' is not allowed; allowed: a number"
    assert isinstance(refuse("a.b", 3, ">= 5"), ValueError)


def test_check_type_coerces_only_int_to_float_and_names_the_key():
    assert check_type(3, float, "k") == 3.0 and type(check_type(3, float, "k")) is float
    assert check_type("1e-3", float, "k") == 0.001  # YAML 1.1's string for 1e-3
    assert check_type(None, Optional[int], "k") is None and check_type(4, Optional[int], "k") == 4
    assert check_type([1, 2], list[int], "k") == [1, 2]
    for value, tp, key, message in [
        (True, int, "a.n", "config key 'a.n': expected an int, got True"),
        (2.5, int, "a.n", "config key 'a.n': expected an int, got 2.5"),
        ("many", float, "a.x", "config key 'a.x': expected a float, got 'many'"),
        (float("nan"), float, "a.x", "config key 'a.x': nan is not allowed; allowed: a finite number"),
        (float("inf"), Optional[float], "a.x", "config key 'a.x': inf is not allowed; allowed: a finite number"),
        ([1, "x"], list[int], "a.l", "config key 'a.l[1]': expected an int, got 'x'"),
        (1, list[int], "a.l", "config key 'a.l': expected a list, got 1"),
        ("mid", Literal["lo", "hi"], "a.m", "config key 'a.m': 'mid' is not one of ['lo', 'hi']"),
        (1, bool, "a.b", "config key 'a.b': expected bool, got 1"),
        ("x", Optional[int], "a.o", "config key 'a.o': 'x' is not of type"),
    ]:
        with pytest.raises(ConfigError) as e:
            check_type(value, tp, key)
        assert str(e.value).startswith(message), (value, str(e.value))


def test_a_value_set_in_code_after_loading_is_refused_naming_the_key():
    for key, value, message in [
        ("rl.epsilon", 1.5, "config key 'rl.epsilon': 1.5 is not allowed; allowed: in [0, 1]"),
        ("grid.backbones", [], "config key 'grid.backbones': [] is not allowed; allowed: a non-empty list"),
        ("rl.seeds", [1, 1], "config key 'rl.seeds': [1, 1] is not allowed; allowed: a list without repeated entries"),
        ("rl.seeds", [0, MAX_SEED + 1], f"config key 'rl.seeds[1]': {MAX_SEED + 1} is not allowed; allowed: an integer "
                                        "in [0, 2**63 - 1]"),
        ("grid.epsilons", [0.1, "x"], "config key 'grid.epsilons[1]': expected a float, got 'x'"),
    ]:
        cfg = load_config("smoke")
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, value)
        with pytest.raises(ConfigError) as e:
            validate(cfg)
        assert str(e.value).startswith(message), (key, str(e.value))
        assert "\n" not in str(e.value)
    cfg = load_config("smoke")
    cfg.rl.seeds = [0, MAX_SEED]  # the largest seed is taken
    assert validate(cfg) is cfg


def test_checks_across_keys_name_the_key_they_refuse():
    with pytest.raises(ConfigError, match=r"^config key 'sampling\.compile': 'default' is not allowed; allowed: none with "
                                          r"sampling\.decode=engine"):
        load_config("smoke", ["sampling.compile=default"])
    assert load_config("smoke", ["sampling.compile=default", "sampling.decode=static"]).sampling.compile == "default"
    with pytest.raises(ConfigError, match=r"^config key 'grid\.transfer_datasets': \['gsm8k'\] is not allowed"):
        load_config("smoke", ["grid.transfer_datasets=[gsm8k]"])
    with pytest.raises(ConfigError, match=r"^config key 'grid\.position_floor': 0\.1 is not allowed; allowed: 0 with "
                                          r"state_prompt\.use=false"):
        load_config("smoke", ["state_prompt.use=false", "grid.position_floor=0.1"])


def test_every_check_across_keys_is_run_by_validate():
    defined = {f for name, f in inspect.getmembers(checks, inspect.isfunction)
               if name.startswith("_check_") and f.__module__ == checks.__name__}
    assert defined and defined == set(CROSS_CHECKS)
    assert len(CROSS_CHECKS) == len(set(CROSS_CHECKS))  # each runs once
