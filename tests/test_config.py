import pytest

from ctrls.config import Config, ConfigError, available_profiles, load_config, override


def test_profiles_load_and_differ():
    assert {"smoke", "demo", "paper"} <= set(available_profiles())
    smoke, demo, paper = (load_config(p) for p in ("smoke", "demo", "paper"))
    assert smoke.profile == "smoke" and paper.states.n_states == 64
    assert paper.grid.n_samples == 20 and paper.grid.temperatures == [0.5, 0.7]
    assert demo.data.n_test > smoke.data.n_test


def test_overrides_are_typed():
    cfg = load_config("smoke", ["pretrain.epochs=7", "grid.epsilons=[0.2, 0.4]", "states.tau=0.5",
                                "sampling.temperature=1"])
    assert cfg.pretrain.epochs == 7
    assert cfg.grid.epsilons == [0.2, 0.4]
    assert cfg.states.tau == 0.5
    assert isinstance(cfg.sampling.temperature, float)


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


def test_unknown_profile_lists_available():
    with pytest.raises(ConfigError, match="smoke"):
        load_config("nope")


def test_override_copies_and_fingerprint_tracks_sections():
    a = load_config("smoke")
    b = override(a, {"pretrain.epochs": 99})
    assert a.pretrain.epochs != 99 and b.pretrain.epochs == 99
    assert a.fingerprint("states") == b.fingerprint("states")
    assert a.fingerprint("pretrain") != b.fingerprint("pretrain")
    c = a.for_pair("Qwen/Qwen2.5-3B-Instruct", "math")
    assert (c.backbone.name, c.data.dataset) == ("Qwen/Qwen2.5-3B-Instruct", "math")
    assert isinstance(c, Config)
