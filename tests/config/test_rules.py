"""ctrls.config.rules: each rule allows exactly the values its words say (the edges included or not as written),
``key`` gives every config a fresh copy of a list default, and a config whose value breaks a key's rule is
refused naming the key, the rule's words and, where the rule has one, why."""
import dataclasses

import pytest

from ctrls.config.rules import (
    Rule,
    above,
    anything,
    at_least,
    between,
    in_range,
    key,
    only,
    path_part,
    text,
    token_temperature,
)
from ctrls.config.schema import ConfigError, load_config


@pytest.mark.parametrize("rule,allowed,words", [
    (at_least(1), [1, 2, 10**9], ">= 1"),
    (above(0), [1e-12, 3.0], "> 0"),
    (between(0, 1), [0, 0.5, 1], "in [0, 1]"),
    (in_range(0, 2, open_lo=True), [1e-9, 2], "in (0, 2]"),
    (in_range(0, 2), [0, 2], "in [0, 2]"),
    (only(-1, 3), [-1, 3], "only -1 or 3"),
    (token_temperature(), [0.01, 1.0, 10.0], "in [0.01, 10]"),
    (token_temperature(greedy=True), [0, 0.01, 10.0], "0 (greedy) or in [0.01, 10]"),
    (text(), ["a", " b "], "a non-empty string"),
    (path_part(), ["demo", "my-run_2", "a.b"], "one directory name"),
])
def test_a_rule_allows_what_its_words_say(rule, allowed, words):
    assert isinstance(rule, Rule) and words in rule.allowed
    assert all(rule.ok(v) for v in allowed)


@pytest.mark.parametrize("rule,refused", [
    (at_least(1), [0, 0.999, -5]),
    (above(0), [0, -1e-12]),
    (between(0, 1), [-1e-9, 1.0000001]),
    (in_range(0, 2, open_lo=True), [0, 2.0001]),
    (only(-1, 3), [0, -2, "3"]),
    (token_temperature(), [0, 0.0099, 10.01]),
    (token_temperature(greedy=True), [0.001, -1, 11]),
    (text(), ["", "   ", 5, None]),
    (path_part(), ["", ".", "..", "a/b", "a\\b", "tab\there", "x" * 201, 7]),
])
def test_a_rule_refuses_what_its_words_exclude(rule, refused):
    assert not any(rule.ok(v) for v in refused), [v for v in refused if rule.ok(v)]


def test_anything_allows_every_value_and_only_keeps_its_reason():
    assert all(anything("a path").ok(v) for v in ("", None, "/x", 3))
    assert only("last_hidden", why="because").why == "because" and at_least(0).why == ""


def test_key_gives_each_instance_its_own_list_and_records_its_rule():
    rule = at_least(0)

    @dataclasses.dataclass
    class Section:
        xs: list = key([1, 2], rule, nonempty=True, unique=True)
        n: int = key(3, rule)

    a, b = Section(), Section()
    a.xs.append(9)
    assert b.xs == [1, 2] and b.n == 3  # the default list is not shared between configs
    meta = {f.name: f.metadata for f in dataclasses.fields(Section)}
    assert meta["xs"] == {"rule": rule, "nonempty": True, "unique": True}
    assert meta["n"] == {"rule": rule, "nonempty": False, "unique": False}


@pytest.mark.parametrize("item,message", [
    ("rl.grad_clip=0", "config key 'rl.grad_clip': 0.0 is not allowed; allowed: > 0"),
    ("policy.concentration=0", "config key 'policy.concentration': 0.0 is not allowed; allowed: in (0, "),
    ("grid.temperatures=[0.001]", "config key 'grid.temperatures[0]': 0.001 is not allowed; allowed: 0 (greedy) or in "
                                  "[0.01, 10]"),
    ("judge.model=' '", "config key 'judge.model': ' ' is not allowed; allowed: a non-empty string"),
    ("profile=a/b", "config key 'profile': 'a/b' is not allowed; allowed: a name that can be one directory name"),
])
def test_a_config_breaking_a_rule_is_refused_naming_the_key_and_the_rule(item, message):
    with pytest.raises(ConfigError) as e:
        load_config("smoke", [item])
    assert str(e.value).startswith(message), str(e.value)


def test_a_refused_value_says_why_when_its_rule_does():
    with pytest.raises(ConfigError) as e:
        load_config("smoke", ["backbone.hidden_layer=-2"])
    msg = str(e.value)
    assert msg.startswith("config key 'backbone.hidden_layer': -2 is not allowed; allowed: only -1 (")
    assert msg.endswith(")") and len(msg.split("(", 1)[1]) > 20  # the rule's reason, in brackets
