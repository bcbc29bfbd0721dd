"""ctrls.data.names: run-file names are injective (a plain name is kept, any other is a readable slug plus the
first 12 hex digits of its sha256, checked by hand), distinct also on a case-insensitive file system, and
colliding ones are listed; a value that cannot be one path component is named with why; a path outside the run
directory is refused (lexically, ``..`` resolved); the file-name limit is the file system's."""
import hashlib

import pytest

from ctrls.config.schema import ConfigError, load_config
from ctrls.data.names import (
    check_component,
    check_inside,
    colliding,
    component_problem,
    file_name,
    inside,
    name_max,
    pair_slug,
    slug,
)
from tests.repo.test_reliability import _dataset_dir


def test_the_name_limit_is_the_file_systems(tmp_path, monkeypatch):
    import os

    from ctrls.data import names
    monkeypatch.setattr(os, "pathconf", lambda p, k: 143)  # e.g. eCryptfs
    assert names.name_max(tmp_path / "not" / "yet") == 143
    ok = _dataset_dir(tmp_path / "short")
    with pytest.raises(ConfigError, match="limit of 143 bytes"):
        load_config("smoke", [f"run_dir={tmp_path}", f"grid.datasets=[{ok}]"])


def test_the_slug_of_unusual_ids_is_readable_and_a_non_string_id_is_named():
    from ctrls.data.names import file_name
    assert file_name("é").startswith("e-") and file_name("e\u0301").startswith("e-")  # NFC and NFD: readable ...
    assert file_name("é") != file_name("e\u0301")  # ... and still two names (the hash is the exact id's)
    assert file_name("Größe?").startswith("Groe-") and file_name("\ud800").startswith("x-")
    with pytest.raises(TypeError, match="got int 5"):
        file_name(5)


@pytest.mark.parametrize("name", ["gsm8k-test-12", "a.b_c-d", "0", "x" * 80])
def test_a_plain_name_is_its_own_file_name(name):
    assert file_name(name) == name


@pytest.mark.parametrize("name,readable", [("A b", "A_b"), ("a/b", "a_b"), (".hidden", "hidden"), ("x" * 81, "x" * 60),
                                           ("Q?", "Q"), ("..", "x"), ("", "x")])
def test_any_other_name_is_a_slug_and_its_sha256(name, readable):
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:12]
    assert file_name(name) == f"{readable}-{digest}"


def test_file_names_are_distinct_for_distinct_names_also_ignoring_case():
    names = ["a b", "a_b", "a?b", "A_B", "a/b", "A B", "a  b", "ab", "AB", "Ab"]
    files = [file_name(n) for n in names]
    assert len({f.casefold() for f in files}) == len(names)
    assert colliding(names) == []


def test_colliding_lists_each_pair_of_names_that_share_a_file_name():
    assert colliding(["x", "X", "y", "x"], to_file=str) == [("x", "X")]  # a repeated name is no collision
    assert colliding(["a", "b", "c"], to_file=lambda n: "same") == [("a", "b"), ("a", "c")]


@pytest.mark.parametrize("value,why", [("", "empty"), ("  ", "empty"), (".", "relative to its parent"),
                                       ("..", "relative to its parent"), ("a/b", "path separator"),
                                       ("a\\b", "path separator"), ("a\nb", "control character"),
                                       ("a\x7fb", "control character"), ("é" * 101, "longer than 200 bytes")])
def test_a_value_that_is_not_one_path_component_is_named_with_why(value, why):
    assert why in component_problem(value)
    with pytest.raises(ValueError, match=rf"the profile .* cannot name a directory: .*{why}"):
        check_component(value, "the profile")


def test_a_value_that_is_one_path_component_passes():
    for value in ("demo", "my run", "a..b", "é" * 100):
        assert component_problem(value) is None and check_component(value, "x") == value


def test_paths_inside_the_run_directory_are_taken_and_others_refused(tmp_path):
    root = tmp_path / "runs"
    assert inside(root, root) and inside(root / "a" / "b", root) and inside(root / "a" / ".." / "b", root)
    assert not inside(tmp_path / "runs-other", root)  # a sibling sharing the prefix is outside
    assert not inside(root / ".." / "x", root) and not inside("/", root)
    assert check_inside(root / "a", root, "a part") == root / "a"
    with pytest.raises(ValueError, match=r"a part .* is outside the run directory .*: refusing to write or delete there"):
        check_inside(root / ".." / "elsewhere", root, "a part")


def test_slugs_of_backbones_and_pairs(tmp_path):
    assert slug("Qwen/Qwen2.5-3B-Instruct") == "Qwen_Qwen2.5-3B-Instruct"  # a hub id: one directory name
    model = tmp_path / "my models" / "ckpt-500"
    model.mkdir(parents=True)
    assert slug(str(model)) == "ckpt-500"  # an existing path: its last component
    assert pair_slug("org/m", "gsm8k") == "org_m__gsm8k"


def test_the_name_limit_of_a_directory_not_yet_made_is_its_parents(tmp_path):
    assert name_max(tmp_path / "not" / "yet") == name_max(tmp_path) > 0
