"""`ctrls stage` errors of the run directory, a missing fit and a damaged file are one line, no traceback.

A stage that another process is writing (its lock is held) printed a 20-line StageBusyError
traceback; a run directory that is writable while the profile's directory under it is read-only
printed an OSError traceback from the lock. Each is now one line on stderr, in the style of the
other errors of ``ctrls.cli.main``: busy exits 1, an unwritable directory exits 2 (as an unwritable
``--run-dir`` does), and a lock that is a symbolic link exits 2 too.
"""
import errno
import os

import pytest

import ctrls.stages.locks as L
import ctrls.stages.runs as R
from ctrls import cli
from ctrls.config.schema import load_config


def lock_file(run_dir):
    st = load_config("smoke", [f"run_dir={run_dir}"]).stage_dir("exploration")
    return st.parent / f".{st.name}.lock"


def run_stage(run_dir, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["stage", "exploration", "--profile", "smoke", "--run-dir", str(run_dir), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    return e.value.code, [ln for ln in err if not ln.startswith(("INFO ", "WARNING "))]  # log lines aside


def test_a_stage_another_process_is_writing_is_one_line(tmp_path, capsys):
    lf = lock_file(tmp_path)
    holder = L.StageLock(lf, "another process")  # another open file description, as another process has
    holder.acquire()
    try:
        code, err = run_stage(tmp_path, capsys)
    finally:
        holder.release()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("ctrls stage: stage ") and "is being written by pid" in err[0], err
    assert str(lf) in err[0]


def test_a_read_only_profile_directory_under_a_writable_run_dir_is_one_line(tmp_path, capsys, monkeypatch):
    """Simulated (the tests may run as root, for whom chmod does not make a directory read-only):
    creating a file in the profile's directory fails with EACCES, as it does there."""
    profile_dir = lock_file(tmp_path).parent
    profile_dir.mkdir(parents=True)
    real_open = os.open

    def read_only(path, flags, *a, **k):
        if os.path.dirname(os.path.abspath(path)) == str(profile_dir) and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", read_only)
    code, err = run_stage(tmp_path, capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith("ctrls stage: "), err
    assert str(profile_dir) in err[0] and "not writable" in err[0] and "Permission denied" in err[0], err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_really_read_only_profile_directory_is_one_line(tmp_path, capsys):
    profile_dir = lock_file(tmp_path).parent
    profile_dir.mkdir(parents=True)
    profile_dir.chmod(0o555)
    try:
        code, err = run_stage(tmp_path, capsys)
    finally:
        profile_dir.chmod(0o755)
    assert code == 2 and len(err) == 1 and str(profile_dir) in err[0], err


def test_a_lock_that_is_a_symbolic_link_is_one_line(tmp_path, capsys):
    lf = lock_file(tmp_path / "runs")
    lf.parent.mkdir(parents=True)
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    os.symlink(precious, lf)
    code, err = run_stage(tmp_path / "runs", capsys)
    assert code == 2 and len(err) == 1 and str(lf) in err[0] and "symbolic link" in err[0], err
    assert precious.read_text() == "keep me"


def test_a_stage_without_its_fit_is_one_line_before_any_backbone(tmp_path, capsys, monkeypatch):
    import ctrls.stages.exploration as E

    monkeypatch.setattr(E, "backbone_for", lambda *a, **k: pytest.fail("loaded a backbone without a fit"))
    code, err = run_stage(tmp_path, capsys)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("ctrls stage: PretrainError: the exploration stage needs a finished pretraining in ")
    assert "(nothing was removed)" in err[0]


def test_a_damaged_artifact_is_one_line(tmp_path, capsys, monkeypatch):
    import ctrls.stages.exploration as E

    def damaged(*a, **k):
        raise R.ArtifactError(f"{tmp_path}/adapter.safetensors: damaged (header too large)\nrun the stage again")

    monkeypatch.setattr(E, "explore", damaged)
    code, err = run_stage(tmp_path, capsys)
    assert code == 1 and err == [f"ctrls stage: ArtifactError: {tmp_path}/adapter.safetensors: damaged (header too large) "
                                 "run the stage again"], err


@pytest.mark.parametrize("error, named", [
    (OSError(errno.ENOSPC, "No space left on device", "{d}/smoke/exploration/part-3.parquet"),
     "{d}/smoke/exploration/part-3.parquet"),
    (RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'),
     "{d}"),
])
def test_a_full_disk_anywhere_in_a_stage_is_one_line_naming_the_path(tmp_path, capsys, monkeypatch, error, named):
    import ctrls.stages.exploration as E

    if isinstance(error, OSError):
        error.filename = error.filename.format(d=tmp_path)

    def full(*a, **k):
        try:
            raise error
        except Exception as e:
            raise RuntimeError("writing a part failed") from e  # a full disk under another error is found too

    monkeypatch.setattr(E, "explore", full)
    code, err = run_stage(tmp_path, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"ctrls stage: cannot write {named.format(d=tmp_path)}: no space left on the device"), err


def test_an_error_that_is_no_full_disk_still_raises(tmp_path, capsys, monkeypatch):
    import ctrls.stages.exploration as E

    monkeypatch.setattr(E, "explore", lambda *a, **k: (_ for _ in ()).throw(ZeroDivisionError("a bug")))
    with pytest.raises(ZeroDivisionError):
        cli.main(["stage", "exploration", "--profile", "smoke", "--run-dir", str(tmp_path), "--quiet"])
