"""ctrls.config.schema: the shipped profiles load, differ and pass every rule; overrides are typed; an unknown
key, a wrong type, a bad value, NaN or infinity, bad YAML and an unknown profile are refused naming the key
(and what is allowed); every key declares its allowed values; overrides split and rejoin as a shell gives
them; the built-in split sizes match the data and a generated dataset's size is bounded."""
import dataclasses
import typing

import pytest
from conftest import requires_data

from ctrls.config import schema as C
from ctrls.config.overrides import join_overrides, parse_overrides, split_overrides
from ctrls.config.schema import Config, ConfigError, available_profiles, load_config, override


def test_profiles_load_and_differ():
    assert {"smoke", "demo", "paper"} <= set(available_profiles())
    smoke, demo, paper = (load_config(p) for p in ("smoke", "demo", "paper"))
    assert smoke.profile == "smoke" and paper.states.n_states == 64
    assert paper.grid.n_samples == 20 and paper.grid.temperatures == [0.5, 0.7]
    assert demo.data.n_test > smoke.data.n_test


@pytest.mark.parametrize("profile", ["smoke", "demo", "paper"])
def test_shipped_profiles_and_defaults_pass_every_rule(profile):
    load_config(profile).validate()
    Config().validate()


def test_overrides_are_typed():
    cfg = load_config("smoke", ["pretrain.epochs=7", "grid.epsilons=[0.2, 0.4]", "states.tau=0.5", "pretrain.lr=1e-3",
                                "policy.concentration=3"])
    assert cfg.pretrain.epochs == 7
    assert cfg.grid.epsilons == [0.2, 0.4]
    assert cfg.states.tau == 0.5
    assert cfg.pretrain.lr == 0.001  # YAML 1.1 reads 1e-3 as a string; a float key takes it
    assert isinstance(cfg.policy.concentration, float)


@pytest.mark.parametrize("item,key", [("pretrain.epoch=3", "pretrain.epoch"), ("nosuch=1", "nosuch"),
                                      ("data.n_test.x=1", "data.n_test.x")])
def test_unknown_key_is_named(item, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("smoke", [item])


@pytest.mark.parametrize("item,key", [("pretrain.epochs=many", "pretrain.epochs"), ("grid.epsilons=0.1", "grid.epsilons"),
                                      ("adapter.inject_at=middle", "adapter.inject_at"), ("data.n_test=2.5", "data.n_test"),
                                      ("prompt.use_chat_template=1", "prompt.use_chat_template")])
def test_wrong_type_is_named(item, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("smoke", [item])


# (override, the key the error must name, the bad value as the error prints it, words of the allowed set)
BAD = [
    # each case it lists
    ("data.n_test=-1", "data.n_test", "-1", ">= 1"),
    ("data.n_train=0", "data.n_train", "0", ">= 1"),
    ("grid.n_samples=0", "grid.n_samples", "0", ">= 1"),
    ("rl.group_size=0", "rl.group_size", "0", ">= 1"),
    ("pretrain.temperature=-1", "pretrain.temperature", "-1.0", "in [0.01, 10]"),
    ("pretrain.temperature=0", "pretrain.temperature", "0.0", "in [0.01, 10]"),
    ("states.n_states=0", "states.n_states", "0", ">= 2"),
    ("states.n_states=1", "states.n_states", "1", ">= 2"),
    ("rl.epsilon=1.5", "rl.epsilon", "1.5", "in [0, 1]"),
    ("grid.epsilons=[1.5]", "grid.epsilons[0]", "1.5", "in [0, 1]"),
    ("grid.epsilons=[0.1, -0.2]", "grid.epsilons[1]", "-0.2", "in [0, 1]"),
    ("sampling.max_new_tokens=0", "sampling.max_new_tokens", "0", ">= 1"),
    # the rest of the declared ranges
    ("grid.temperatures=[-0.5]", "grid.temperatures[0]", "-0.5", "0 (greedy) or in [0.01, 10]"),
    ("rl.steps=-1", "rl.steps", "-1", ">= 0"),
    ("rl.lr=0", "rl.lr", "0.0", "in (0, 10]"),
    ("pretrain.lr=-1e-3", "pretrain.lr", "-0.001", "in (0, 10]"),
    ("policy.fit_lr=0", "policy.fit_lr", "0.0", "in (0, 10]"),
    ("rl.eval_every=0", "rl.eval_every", "0", ">= 1"),
    ("rl.checkpoint_every=0", "rl.checkpoint_every", "0", ">= 1"),
    ("rl.seeds=[]", "rl.seeds", "[]", "non-empty"),
    ("rl.seeds=[0, 0]", "rl.seeds", "[0, 0]", "without repeated"),
    ("rl.settings=['eps=1.5']", "rl.settings[0]", "'eps=1.5'", "X in [0, 1]"),
    ("rl.table2=['H=-1']", "rl.table2[0]", "'H=-1'", "Y in [0, 10]"),
    ("rl.settings=[greedy]", "rl.settings[0]", "'greedy'", "none, epsilon"),
    ("pretrain.sources=[]", "pretrain.sources", "[]", "non-empty"),
    ("grid.datasets=[gsm8k, nosuch]", "grid.datasets[1]", "'nosuch'", "gsm8k, math, gsm_symbolic"),
    ("data.dataset=/no/such/dir", "data.dataset", "'/no/such/dir'", "a directory holding train.jsonl"),
    ("prompt.few_shot=6", "prompt.few_shot", "6", "EXEMPLARS"),
    ("prompt.max_steps=0", "prompt.max_steps", "0", ">= 1"),
    ("spectral.k=0", "spectral.k", "0", ">= 1"),
    ("states.tau=0", "states.tau", "0.0", "in [1e-06, 1e+06], or null"),
    ("data.max_bad_fraction=2", "data.max_bad_fraction", "2.0", "in [0, 1]"),
    ("judge.temperature=3", "judge.temperature", "3.0", "in [0, 2]"),
    ("judge.base_url=localhost:8000", "judge.base_url", "'localhost:8000'", "http(s) URL"),
    ("judge.timeout_s=0", "judge.timeout_s", "0.0", "in (0, 3600]"),
    ("backbone.device=gpu", "backbone.device", "'gpu'", "torch device"),
    ("seed=-3", "seed", "-3", ">= 0"),
    # finite values that overflow a loss or the logits: coefficients have ranges
    ("rl.entropy_coef=1e308", "rl.entropy_coef", "1e+308", "in [0, 10]"),
    ("rl.settings=['H=1e308']", "rl.settings[0]", "'H=1e308'", "Y in [0, 10]"),
    ("judge.settings=['eps=0.1,H=1e308']", "judge.settings[0]", "'eps=0.1,H=1e308'", "Y in [0, 10]"),
    ("synthetic.alphas=[1e308]", "synthetic.alphas[0]", "1e+308", "in [0, 10]"),
    ("rl.lr=1e308", "rl.lr", "1e+308", "in (0, 10]"),
    ("policy.concentration=1e308", "policy.concentration", "1e+308", "in (0, 10000]"),
    ("synthetic.concentration=1e308", "synthetic.concentration", "1e+308", "in (0, 10000]"),
    ("policy.count_smoothing=1e308", "policy.count_smoothing", "1e+308", "in (0, 1e+06]"),
    ("rl.temperature=1e-320", "rl.temperature", "1e-320", "in [0.01, 10]"),
    # names that become directories
    ("profile=/abs/dir", "profile", "'/abs/dir'", "one directory name"),
    ("profile=../../x", "profile", "'../../x'", "one directory name"),
    # NaN and infinities, in any float key
    ("rl.lr=.nan", "rl.lr", "nan", "finite"),
    ("states.tau=.inf", "states.tau", "inf", "finite"),
    ("grid.temperatures=[0.7, .inf]", "grid.temperatures[1]", "inf", "finite"),
    # refused options: the message says why
    ("backbone.hidden_layer=-2", "backbone.hidden_layer", "-2", "only -1 (pretraining would fit"),
    ("adapter.inject_at=input_embeds", "adapter.inject_at", "'input_embeds'", "only 'last_hidden' (pretraining and decoding"),
    # across keys
    ("rl.temperature=0.5", "rl.temperature", "0.5", "one of grid.temperatures [0.7]"),
    ("data.n_test=1320", "data.n_test", "1320", "1 to 1319"),
]


@pytest.mark.parametrize("item,key,value,allowed", BAD, ids=[b[0] for b in BAD])
def test_bad_value_names_key_value_and_allowed(item, key, value, allowed):
    with pytest.raises(ConfigError) as e:
        load_config("smoke", [item])
    msg = str(e.value)
    assert f"config key {key!r}: {value} is not allowed; allowed: " in msg
    assert allowed in msg.split("allowed: ", 1)[1]
    assert "\n" not in msg


def config_keys(cls=Config, prefix=""):
    """(dotted key, type, dataclass field) of every leaf key of the config."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from config_keys(tp, prefix + f.name + ".")
        else:
            yield prefix + f.name, tp, f


def test_every_key_declares_its_values():
    """Each key has a declared rule (``config.key(default, rule)``), or a bool/Literal type that is
    its own set. A key added without one fails here: declare its allowed values."""
    def self_evident(tp):
        args = typing.get_args(tp)
        return tp is bool or typing.get_origin(tp) is typing.Literal or \
            (typing.get_origin(tp) is list and len(args) == 1 and self_evident(args[0]))

    undeclared = [k for k, tp, f in config_keys() if f.metadata.get("rule") is None and not self_evident(tp)]
    assert not undeclared, f"keys without declared allowed values: {undeclared}"
    assert len(list(config_keys())) > 70


def float_keys():
    return [(k, tp) for k, tp, _ in config_keys() if float in (tp, *typing.get_args(tp))]


@pytest.mark.parametrize("key,tp", float_keys(), ids=[k for k, _ in float_keys()])
@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf"])
def test_no_float_key_takes_nan_or_inf(key, tp, bad):
    value = f"[{bad}]" if typing.get_origin(tp) is list else bad
    with pytest.raises(ConfigError, match=rf"config key '{key}(\[0\])?': -?(nan|inf) is not allowed; allowed: a finite number"):
        load_config("smoke", [f"{key}={value}"])


def test_sampling_temperature_is_gone_and_stage_keys_resolve():
    assert "temperature" not in {f.name for f in dataclasses.fields(C.SamplingConfig)}
    with pytest.raises(ConfigError, match=r"'sampling\.temperature' was removed: no stage read it"):
        load_config("smoke", ["sampling.temperature=0.7"])
    with pytest.raises(ConfigError, match="was removed"):  # nested, as an old profile writes it
        override(Config(), {"sampling": {"temperature": 0.7}})
    # every fingerprint a stage keys its cache on still resolves, and tracks its keys
    from ctrls.stages import exploration, pretrain, rl

    cfg = load_config("smoke")
    for keys in [*pretrain.KEYS.values(), exploration.KEYS, rl.RL_KEYS, ("judge", "seed", "grid", "rl", "data")]:
        assert len(cfg.fingerprint(*keys)) == 16
    assert cfg.fingerprint(*exploration.KEYS) != override(cfg, {"sampling.top_k": 7}).fingerprint(*exploration.KEYS)
    with pytest.raises(ConfigError, match=r"unknown config key 'sampling\.temperature'"):
        cfg.fingerprint("sampling.temperature")


def test_unknown_profile_lists_available():
    with pytest.raises(ConfigError, match="smoke"):
        load_config("nope")


def test_bad_yaml_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"override 'grid\.epsilons=\[0\.1, 0\.3': unbalanced brackets"):
        load_config("smoke", ["grid.epsilons=[0.1, 0.3"])
    with pytest.raises(ConfigError, match=r"override 'rl\.settings=\{a: \[1\}\]': the value is not valid YAML"):
        parse_overrides(["rl.settings={a: [1}]"])
    p = tmp_path / "mine.yaml"
    p.write_text("data: {n_test: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(p))


def test_override_and_for_pair_validate():
    a = load_config("smoke")
    with pytest.raises(ConfigError, match=r"'rl\.group_size': 0"):
        override(a, {"rl.group_size": 0})
    with pytest.raises(ConfigError, match=r"'data\.dataset': '/no/such/dir'"):
        a.for_pair("smollm2-135m-instruct", "/no/such/dir")
    a.rl.epsilon = 2.0  # set in code: caught by validate
    with pytest.raises(ConfigError, match=r"'rl\.epsilon': 2\.0"):
        a.validate()


# ---- the string form of the overrides (papermill's ``overrides`` parameter) ------------------

def test_split_overrides_keeps_brackets_and_quotes_together():
    assert split_overrides("grid.epsilons=[0.1, 0.3] rl.steps=3") == ["grid.epsilons=[0.1, 0.3]", "rl.steps=3"]
    assert split_overrides("  a={x: [1, 2], y: 3}\tb='p q'  c=\"r s\" d=o'brien e='it''s so' ") == \
        ["a={x: [1, 2], y: 3}", "b='p q'", 'c="r s"', "d=o'brien", "e='it''s so'"]
    assert parse_overrides("grid.epsilons=[0.1, 0.3] judge.model='my model' x=o'brien") == \
        {"grid.epsilons": [0.1, 0.3], "judge.model": "my model", "x": "o'brien"}
    assert split_overrides("") == [] and parse_overrides("") == {}
    for bad in ("a=[1, 2", "a=1]", "b='p q"):
        with pytest.raises(ConfigError, match="unbalanced"):
            split_overrides(bad)


def test_list_overrides_rejoin_what_a_shell_split():
    # `-o grid.epsilons=[0.1, 0.3] rl.steps=3` unquoted reaches argparse as three items
    assert parse_overrides(["grid.epsilons=[0.1,", "0.3]", "rl.steps=3"]) == {"grid.epsilons": [0.1, 0.3], "rl.steps": 3}
    # a quoted item with a bare space (a path) stays one item
    assert parse_overrides(["data.data_dir=/my data/x", "rl.steps=3"]) == {"data.data_dir": "/my data/x", "rl.steps": 3}
    with pytest.raises(ConfigError, match=r"override '0\.3\]': unbalanced brackets"):
        parse_overrides(["0.3]"])


@pytest.mark.parametrize("items", [["grid.epsilons=[0.1, 0.3]", "rl.steps=3"], ["grid.epsilons=[0.1,", "0.3]"],
                                   ["data.data_dir=/my data/x", "judge.model='a b'", "rl.settings=[eps=0.1, 'H=0.01']"],
                                   []])
def test_join_overrides_round_trips(items):
    assert parse_overrides(join_overrides(items)) == parse_overrides(items)


@requires_data
@pytest.mark.integration
def test_builtin_split_sizes_match_the_data():
    from ctrls.data.problems import load_problems

    sizes = C._builtin_sizes()
    assert {(d, s): len(load_problems(d, s)) for d in sizes for s in sizes[d]} == \
        {(d, s): n for d in sizes for s, n in sizes[d].items()}


# ---- bounded generated datasets ---------------


def test_load_problems_refuses_a_generated_size_beyond_the_bound():
    from ctrls.data.problems import DataError, load_problems

    with pytest.raises(DataError, match="at most 100000"):
        load_problems("gsm_symbolic", "test", n=10**18)


def test_logging_changes_no_stage_key():
    """rl.tensorboard only logs: turning it on leaves the RL stage's key (and its results) as they are; the
    learning rate, which changes the result, does not."""
    from ctrls.config.schema import load_config, override
    from ctrls.stages.rl import RL_KEYS

    cfg = load_config("smoke")
    assert override(cfg, {"rl.tensorboard": True}).fingerprint(*RL_KEYS) == cfg.fingerprint(*RL_KEYS)
    assert override(cfg, {"rl.lr": cfg.rl.lr * 2}).fingerprint(*RL_KEYS) != cfg.fingerprint(*RL_KEYS)


def test_the_grid_lists_name_the_single_pair_keys_they_leave_unset():
    cfg = load_config("demo", ["grid.backbones=[my-org/my-model]", "grid.datasets=[math]"])
    assert (cfg.backbone.name, cfg.data.dataset) == ("my-org/my-model", "math")  # what pretrain(cfg) runs on
    kept = load_config("demo", ["grid.backbones=[my-org/my-model]", "backbone.name=other/model"])
    assert kept.backbone.name == "other/model"  # set explicitly: kept
    both = load_config("smoke", {"grid": {"backbones": ["a/b", "smollm2-135m-instruct"]}})
    assert both.backbone.name == "smollm2-135m-instruct"  # already one of the list: unchanged
    paper = load_config("paper")
    assert paper.backbone.name == "Qwen/Qwen2.5-3B-Instruct"  # a profile's own values stand
