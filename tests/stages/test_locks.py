"""One writer per stage.

``Stage.begin`` takes an exclusive lock on the stage (``.<stage>.lock`` next to its directory, an
``fcntl.flock`` on a file that holds the holder's pid and host). A second process that begins the
same stage with the same config fails at once with a message naming the holder (another config writes
its own slot beside it),
before it clears or deletes anything. A lock left by a process that died is taken over. The lock
is released by ``finish`` and on an exception (``with stage.begin(): ...``). Reading a finished
stage (``is_done``, ``digest``, ``summary``) never takes it. Processes are real subprocesses.
"""
import errno
import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

import ctrls.stages.locks as L
from ctrls.config.schema import load_config
from ctrls.stages.runs import Stage, StageBusyError

WRITER = r"""
import sys
from ctrls.config.schema import load_config
from ctrls.stages.runs import Stage

run_dir, seed = sys.argv[1], sys.argv[2]
st = Stage(load_config("smoke", [f"run_dir={run_dir}", f"seed={seed}"]), "a", ("seed",)).begin()
(st.dir / "out.txt").write_text(f"written by seed {seed}")
print("began", flush=True)
if sys.stdin.readline().strip() == "finish":
    st.finish(rows=1)
    print("finished", flush=True)
"""


def cfg_at(run_dir, seed=0):
    return load_config("smoke", [f"run_dir={run_dir}", f"seed={seed}"])


@pytest.fixture
def writer(tmp_path):
    """Start a writer process that begins stage 'a' of ``run_dir`` and waits; killed at the end."""
    procs = []

    def start(run_dir, seed):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), str(seed)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        line = p.stdout.readline()
        assert line.strip() == "began", p.stderr.read()
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_second_writer_fails_at_once_and_another_config_writes_beside(tmp_path, writer):
    """A second writer of a running stage under the same config fails at once naming the holder; one under another
    config writes its own slot beside it: neither waits nor clears the first one's work, which finishes intact."""
    first = writer(tmp_path, seed=1)
    st_dir = Stage(cfg_at(tmp_path, 1), "a", ("seed",)).dir
    t0 = time.time()
    second = Stage(cfg_at(tmp_path, 1), "a", ("seed",))  # the same config
    with pytest.raises(StageBusyError) as e:
        second.begin()
    msg = str(e.value)
    assert f"pid {first.pid} on host {socket.gethostname()}" in msg and str(second.lock_file) in msg
    beside = Stage(cfg_at(tmp_path, 2), "a", ("seed",))  # another config: its own slot, beside the running one
    assert beside.dir != st_dir
    beside.begin().finish()
    assert time.time() - t0 < 5  # at once, not after a wait
    assert (st_dir / "out.txt").read_text() == "written by seed 1"  # the first writer's work is intact

    first.stdin.write("finish\n")
    first.stdin.flush()
    assert first.stdout.readline().strip() == "finished" and first.wait(timeout=60) == 0
    assert Stage(cfg_at(tmp_path, 1), "a", ("seed",)).is_done()
    assert not second.lock_file.exists()  # released when the stage finished
    assert Stage(cfg_at(tmp_path, 2), "a", ("seed",)).is_done()  # each config's run is kept, beside the other


def test_a_lock_left_by_a_killed_writer_is_taken_over(tmp_path, writer, caplog):
    first = writer(tmp_path, seed=1)
    st = Stage(cfg_at(tmp_path, 1), "a", ("seed",))
    first.kill()  # SIGKILL: no cleanup; the lock file stays, naming a dead pid
    first.wait()
    assert json.loads(st.lock_file.read_text())["pid"] == first.pid
    with caplog.at_level(logging.INFO, logger="ctrls.stages.locks"):
        st.begin()  # the kernel dropped the dead process's flock
    assert f"pid {first.pid}" in caplog.text and "took over" in caplog.text
    assert json.loads(st.lock_file.read_text())["pid"] == os.getpid()
    assert (st.dir / "out.txt").exists()  # same key: an interrupted stage resumes from what it wrote
    st.finish()
    assert not st.lock_file.exists()


def free(lock_file) -> bool:
    """Whether another holder (another open file description, as another process has) gets the lock now."""
    other = L.StageLock(lock_file, "probe")
    try:
        other.acquire()
    except StageBusyError:
        return False
    other.release()
    return True


def test_the_lock_is_released_on_finish_and_on_an_exception(tmp_path):
    st = Stage(cfg_at(tmp_path), "a", ("seed",)).begin()
    assert st.lock_file.exists() and not free(st.lock_file)
    (st.dir / "x").write_text("x")
    st.finish()
    assert free(st.lock_file) and not st.lock_file.exists()
    assert sorted(os.listdir(st.dir.parent)) == ["a"]  # nothing of the lock is left next to the outputs
    assert "x" in json.loads(st.done_file.read_text())["files"] and len(json.loads(st.done_file.read_text())["files"]) == 1

    st = Stage(cfg_at(tmp_path, 1), "a", ("seed",))
    with pytest.raises(RuntimeError, match="stage failed"):
        with st.begin():
            assert not free(st.lock_file)
            raise RuntimeError("stage failed")
    assert free(st.lock_file) and not st.lock_file.exists()


def test_the_same_process_may_begin_its_own_stage_again(tmp_path):
    """A rerun in the same process after an exception that skipped the release (a notebook, a
    test's simulated kill) resumes: the process holds the lock, it is not a second writer."""
    first = Stage(cfg_at(tmp_path), "a", ("seed",)).begin()
    (first.dir / "part").write_text("1")
    again = Stage(cfg_at(tmp_path), "a", ("seed",)).begin()  # first was never finished nor released
    assert (again.dir / "part").read_text() == "1"
    again.finish()
    assert not again.lock_file.exists()
    first.release()  # a no-op now


def test_reading_a_finished_stage_takes_no_lock(tmp_path, monkeypatch):
    st = Stage(cfg_at(tmp_path), "a", ("seed",)).begin()
    (st.dir / "x").write_text("x")
    st.finish(rows=3)
    before = sorted(p for p in tmp_path.rglob("*"))

    def no_lock(self):
        raise AssertionError("a read took the stage's lock")

    monkeypatch.setattr(L.StageLock, "acquire", no_lock)  # as on a read-only mount: no lock can be taken
    again = Stage(cfg_at(tmp_path), "a", ("seed",))
    assert again.is_done() and again.digest() and again.summary()["rows"] == 3
    down = Stage(cfg_at(tmp_path), "down", ("seed",), inputs=(again,))
    assert not down.is_done()
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written, no lock file


@pytest.fixture
def no_flock(monkeypatch):
    """A file system without flock (some network and FUSE mounts): the recorded pid is the lock."""
    import fcntl

    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_without_flock_a_live_holder_blocks_and_a_dead_one_is_taken_over(tmp_path, no_flock, caplog):
    st = Stage(cfg_at(tmp_path), "a", ("seed",))
    st.lock_file.parent.mkdir(parents=True)
    live = os.getppid()  # alive, and not this process
    st.lock_file.write_text(json.dumps({"pid": live, "host": socket.gethostname()}))
    with pytest.raises(StageBusyError, match=f"pid {live} on host {socket.gethostname()}"):
        st.begin()
    st.lock_file.write_text(json.dumps({"pid": 4242, "host": "elsewhere"}))  # can't tell: held
    with pytest.raises(StageBusyError, match="another host.*remove"):
        st.begin()
    for garbage in ({"pid": "x"}, {"pid": -1}, {"pid": True}, []):  # no holder recorded: taken
        st.lock_file.write_text(json.dumps(garbage))
        st.begin().release()
    dead = dead_pid()
    st.lock_file.write_text(json.dumps({"pid": dead, "host": socket.gethostname()}))
    with caplog.at_level(logging.WARNING, logger="ctrls.stages.locks"):
        st.begin()
    assert f"pid {dead}" in caplog.text and "no longer runs" in caplog.text
    assert json.loads(st.lock_file.read_text())["pid"] == os.getpid()
    st.finish()
    assert not st.lock_file.exists()
