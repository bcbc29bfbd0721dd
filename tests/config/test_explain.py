"""Every config key documents itself: a docstring under each field, read from the source, and
``ctrls config --explain [KEY]`` printing it."""
import dataclasses
import typing

import pytest

from ctrls import cli
from ctrls.config import explain
from ctrls.config.schema import Config, RLConfig


def config_classes(cls=Config):
    """Every dataclass of the config tree: Config and each section it nests, at any depth."""
    out = [cls]
    for tp in typing.get_type_hints(cls).values():
        if dataclasses.is_dataclass(tp):
            out += [c for c in config_classes(tp) if c not in out]
    return out


def test_every_field_of_every_config_dataclass_has_a_docstring():
    classes = config_classes()
    assert len(classes) >= 15
    undocumented = [f"{c.__name__}.{name}" for c in classes for name, doc in explain.class_docs(c).items()
                    if not doc.strip()]
    assert not undocumented, f"fields without a docstring on the line under them: {undocumented}"
    assert explain.missing_docs() == []
    assert sum(len(dataclasses.fields(c)) for c in classes) == len(explain.field_docs()) > 120


@dataclasses.dataclass
class _Documented:
    a: int = 1
    """the first"""
    b: int = 2  # a comment is not a docstring
    c: int = 3
    d: str = "x"
    """the last,
    on two lines"""


def test_a_field_without_a_docstring_is_found():
    assert explain.class_docs(_Documented) == {"a": "the first", "b": "", "c": "", "d": "the last,\non two lines"}


def test_field_docs_are_the_source_docstrings_by_dotted_key():
    docs = explain.field_docs()
    assert list(docs)[:4] == ["profile", "run_dir", "seed", "data"]
    assert docs["rl.lr"] == explain.class_docs(RLConfig)["lr"] and "learning rate" in docs["rl.lr"]
    assert "data.word_problems.n_ops" in docs and "data.word_problems" in docs  # sections are keys too
    leaves = {k for k in docs if not explain.info(k).section}
    assert leaves == set(flatten(Config().to_dict()))


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_explain_prints_the_key_its_default_rule_and_docstring(capsys):
    code, out, err = run(["config", "--explain", "rl.lr"], capsys)
    assert code == 0 and not err
    lines = out.splitlines()
    assert lines[0] == "rl.lr: float = 0.01"
    assert lines[1] == "  allowed: in (0, 10]"
    assert " ".join(" ".join(lines[2:]).split()) == " ".join(explain.field_docs()["rl.lr"].split())


def test_explain_a_section_lists_its_keys(capsys):
    code, out, _ = run(["config", "--explain", "rl"], capsys)
    assert code == 0 and out.startswith("rl: section (RLConfig)\n")
    keys = [line.split()[0] for line in out.split("\n\n", 1)[1].splitlines()]
    assert keys == [f"rl.{f.name}" for f in dataclasses.fields(RLConfig)]


def test_explain_without_a_key_lists_every_key_with_its_default(capsys):
    code, out, _ = run(["config", "--explain"], capsys)
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert code == 0 and list(rows) == list(explain.field_docs())
    assert rows["rl.lr"].split()[1] == "0.01" and "learning rate" in rows["rl.lr"]
    assert "[0.1, 0.3, 0.5]" in rows["grid.epsilons"]
    assert rows["rl"].split()[1] == "(section)"


@pytest.mark.parametrize("key,close", [("rl.lrr", "rl.lr"), ("lr", "pretrain.lr"), ("rl.seed", "rl.seeds"),
                                       ("grid.epsilon", "grid.epsilons")])
def test_an_unknown_key_exits_2_naming_the_closest_keys(capsys, key, close):
    code, out, err = run(["config", "--explain", key], capsys)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "config error" in err
    assert f"unknown config key {key!r}" in err
    assert close in err.split("closest known keys:", 1)[1].replace(",", " ").split()


def test_a_key_near_nothing_is_told_where_to_look_and_a_removed_key_what_became_of_it(capsys):
    code, _, err = run(["config", "--explain", "zzzz"], capsys)
    assert code == 2 and "'zzzz'" in err and "ctrls config --explain lists every key" in err
    code, _, err = run(["config", "--explain", "sampling.temperature"], capsys)
    assert code == 2 and "was removed" in err and "rl.temperature" in err


def test_config_needs_explain(capsys):
    code, _, err = run(["config"], capsys)
    assert code == 2 and "--explain" in err
