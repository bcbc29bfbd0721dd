"""A ``done`` marker cannot point outside its stage.

Every path a marker names is resolved (``..`` and symbolic links) and must lie inside its stage's
directory (or an ``extra`` output of the stage); otherwise the marker is corrupt: named in the log,
nothing it names is checked or deleted, and the stage is cleared (its own directory only) and run
again. A marker that is not the JSON object the stage wrote (``[]``, a string, wrong field types)
is corrupt the same way, never an AttributeError.
"""
import json
import logging
import os

import pytest

from ctrls.config.schema import load_config
from ctrls.stages.runs import Stage


def cfg_at(run_dir):
    return load_config("smoke", [f"run_dir={run_dir}"])


def finished(run_dir, name, extra=()):
    st = Stage(cfg_at(run_dir), name, ("seed",), extra=extra).begin()
    (st.dir / "sub").mkdir()
    (st.dir / "x.bin").write_bytes(b"x" * 100)
    (st.dir / "sub" / "y.txt").write_text("why")
    st.finish(rows=1)
    return st


def snapshot(root):
    """{path: bytes} of every file under ``root`` (what must survive)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ``rel`` is what the marker lists (relative to the stage directory smoke/a, as Stage.manifest writes it)
ESCAPES = {
    "the run directory": "../..",
    "the parent of the run directory": "../../..",
    "the profile directory": "..",
    "another stage": "../b",
    "another stage's file": "../b/x.bin",
    "the stage directory itself": ".",
    "the empty path": "",
    "an absolute path": "/etc/hostname",
    "its own marker": "done",
    "its own key": "key",
    "a symlink out of the stage": "link/x.bin",
    "a symlinked directory out of the stage": "link",
}


@pytest.mark.parametrize("what", list(ESCAPES))
def test_a_marker_naming_a_path_outside_its_stage_is_corrupt_and_deletes_nothing_outside(tmp_path, caplog, what):
    runs = tmp_path / "runs"
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    a, b = finished(runs, "a"), finished(runs, "b")
    os.symlink(b.dir, a.dir / "link")  # a link inside stage a to stage b
    rel = ESCAPES[what]
    rec = json.loads(a.done_file.read_text())
    rec["files"][rel] = "0" * 64  # a wrong checksum: a trusting rerun would delete the path as a bad output
    a.done_file.write_text(json.dumps(rec))
    before_b, before_runs_parent = snapshot(b.dir), outside.read_text()

    again = Stage(cfg_at(runs), "a", ("seed",))
    with caplog.at_level(logging.WARNING, logger="ctrls.stages.runs"):
        assert not again.is_done()
        again.begin()
    # nothing outside the stage was touched: stage b, the run directory, the file above it
    assert runs.is_dir() and snapshot(b.dir) == before_b and Stage(cfg_at(runs), "b", ("seed",)).is_done()
    assert outside.read_text() == before_runs_parent
    assert f"{a.done_file} is corrupt" in caplog.text and repr(rel) in caplog.text
    # the stage itself was cleared and is redone
    assert not (a.dir / "x.bin").exists() and not a.done_file.exists()
    (a.dir / "x.bin").write_bytes(b"x" * 100)
    again.finish(rows=1)
    assert Stage(cfg_at(runs), "a", ("seed",)).is_done()


def test_an_extra_output_outside_the_stage_directory_is_still_trusted(tmp_path):
    """The stage's own ``extra`` outputs (e.g. the adapter's checkpoint) are inside the stage."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "w.bin").write_bytes(b"w")
    st = finished(tmp_path, "a", extra=(ckpt,))
    assert "../../ckpt/w.bin" in json.loads(st.done_file.read_text())["files"]
    assert Stage(cfg_at(tmp_path), "a", ("seed",), extra=(ckpt,)).is_done()
    # but the same marker read by a stage without that extra is corrupt
    assert not Stage(cfg_at(tmp_path), "a", ("seed",)).is_done()


BAD_MARKERS = {
    "a list": [],
    "a string": "done",
    "a number": 42,
    "null": None,
    "a key that is a list": {"key": ["x"], "files": {}},
    "files that are a list": {"key": "KEY", "files": ["x.bin"]},
    "a checksum that is a number": {"key": "KEY", "files": {"x.bin": 5}},
    "inputs that are a list": {"key": "KEY", "files": {}, "inputs": ["up"]},
}


@pytest.mark.parametrize("what", list(BAD_MARKERS))
def test_a_marker_that_is_not_the_expected_object_is_corrupt_not_a_traceback(tmp_path, caplog, what):
    st = finished(tmp_path, "a")
    down_cfg = cfg_at(tmp_path)
    marker = json.loads(json.dumps(BAD_MARKERS[what]).replace('"KEY"', json.dumps(st.key)))
    st.done_file.write_text(json.dumps(marker))
    again = Stage(down_cfg, "a", ("seed",))
    with caplog.at_level(logging.WARNING, logger="ctrls.stages.runs"):
        assert not again.is_done()
        assert again.digest() is None and again.summary() == {}
        down = Stage(down_cfg, "down", ("seed",), inputs=(again,))
        assert not down.is_done()
        again.begin()
    assert f"{st.done_file} is corrupt" in caplog.text
    assert not (st.dir / "x.bin").exists() and not again.done_file.exists()  # cleared, runs again
    (st.dir / "x.bin").write_bytes(b"x")
    again.finish()
    assert Stage(down_cfg, "a", ("seed",)).is_done()
