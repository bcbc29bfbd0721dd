"""A stage's lock and markers never follow a symbolic link.

A lock file (``.<stage>.lock``) or a marker (``done``, ``key``, ``config.yaml``, the ``done`` marker's
temp file) that is a symbolic link is refused with :class:`UnsafeLinkError` naming it: a user's file
outside the run directory is neither truncated nor overwritten through it, a dangling link creates
nothing where it points, and nothing outside the run directory is written or created.
"""
import json
import os

import pytest

from ctrls.config.schema import load_config
from ctrls.stages.runs import Stage, UnsafeLinkError


def cfg_at(run_dir):
    return load_config("smoke", [f"run_dir={run_dir}"])


@pytest.fixture
def precious(tmp_path):
    """A user's file outside the run directory."""
    p = tmp_path / "precious.txt"
    p.write_text("keep me")
    return p


def stage(tmp_path):
    return Stage(cfg_at(tmp_path / "runs"), "a", ("seed",))


@pytest.mark.parametrize("flock", [True, False], ids=["flock", "pid lock"])
def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path, precious, monkeypatch, flock):
    if not flock:  # a file system without flock: the pid path opened the file with O_CREAT too
        import errno
        import fcntl

        def no_flock(fd, op):
            raise OSError(errno.ENOLCK, "No locks available")

        monkeypatch.setattr(fcntl, "flock", no_flock)
    st = stage(tmp_path)
    st.lock_file.parent.mkdir(parents=True)
    os.symlink(precious, st.lock_file)
    with pytest.raises(UnsafeLinkError) as e:
        st.begin()
    assert str(st.lock_file) in str(e.value) and "symbolic link" in str(e.value)
    assert precious.read_text() == "keep me"
    assert not st.dir.exists()  # refused before anything was created or cleared


def test_a_dangling_lock_link_creates_nothing_outside(tmp_path):
    st = stage(tmp_path)
    st.lock_file.parent.mkdir(parents=True)
    target = tmp_path / "elsewhere" / "made.txt"
    target.parent.mkdir()
    os.symlink(target, st.lock_file)
    with pytest.raises(UnsafeLinkError, match="symbolic link"):
        st.begin()
    assert not target.exists()


@pytest.mark.parametrize("marker", ["key", "config.yaml", "done"])
def test_a_marker_that_is_a_symlink_is_refused_when_the_stage_begins(tmp_path, precious, marker):
    st = stage(tmp_path).begin()
    (st.dir / "x").write_text("x")
    st.finish()
    (st.dir / marker).unlink()
    os.symlink(precious, st.dir / marker)
    again = stage(tmp_path)
    with pytest.raises(UnsafeLinkError) as e:
        again.begin(keep=True)  # keep: nothing clears the directory first
    assert str(st.dir / marker) in str(e.value)
    assert precious.read_text() == "keep me"
    assert not again.lock_file.exists()  # the refused stage gave its lock back


def test_a_done_marker_that_is_a_symlink_is_never_read(tmp_path, precious):
    st = stage(tmp_path).begin()
    st.finish()
    fake = tmp_path / "fake_done.json"
    fake.write_text(json.dumps({"key": st.key, "files": {}, "inputs": {}}))
    st.done_file.unlink()
    os.symlink(fake, st.done_file)
    with pytest.raises(UnsafeLinkError, match="done"):
        stage(tmp_path).is_done()


def test_the_done_markers_temp_file_is_never_written_through_a_link(tmp_path, precious):
    st = stage(tmp_path).begin()
    (st.dir / "x").write_text("x")
    os.symlink(precious, st.dir / "done.tmp")  # the temp name finish() used to write
    st.finish()
    assert precious.read_text() == "keep me"
    assert json.loads(st.done_file.read_text())["key"] == st.key and not st.done_file.is_symlink()

