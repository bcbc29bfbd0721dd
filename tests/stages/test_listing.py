"""``ctrls runs``: the stored runs with their overrides, commit and time; ``ctrls runs rm``: the explicit removal."""
import shutil

import pandas as pd
import pytest
from conftest import requires_data

from ctrls import cli
from ctrls.config.schema import load_config
from ctrls.stages.listing import RunNotFoundError, remove_run, stored_runs
from ctrls.stages.runs import Stage, sha256_file


def _finished(run_dir, *overrides):
    cfg = load_config("smoke", [f"run_dir={run_dir}", *overrides])
    st = Stage(cfg, "a", ("seed",), extra=(run_dir / "smoke" / "ckpt",)).begin()
    (st.dir / "out.bin").write_bytes(repr(overrides).encode())
    st.extra[0].mkdir()
    (st.extra[0] / "model.bin").write_bytes(b"weights")
    st.finish()
    return st


def test_runs_lists_each_run_with_its_overrides_commit_and_time(tmp_path, capsys):
    own, other = _finished(tmp_path), _finished(tmp_path, "seed=5")
    runs = {r.name: r for r in stored_runs(tmp_path)}
    assert set(runs) == {"smoke/a", f"smoke/a@{other.key}"}
    assert runs["smoke/a"].overrides == [] and runs["smoke/a"].slot is None
    assert runs[f"smoke/a@{other.key}"].overrides == ["seed=5"] and runs[f"smoke/a@{other.key}"].slot == other.key
    assert all(r.finished and r.commit and r.time.endswith("Z") for r in runs.values())
    with pytest.raises(SystemExit) as e:
        cli.main(["runs", "--run-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "smoke/a " in out and f"smoke/a@{other.key}" in out and "seed=5" in out
    assert "(the profile's own)" in out and own.key not in out.split("\n")[1]


def test_runs_rm_removes_one_run_and_what_it_wrote_beside_it_only(tmp_path, capsys):
    own, other = _finished(tmp_path), _finished(tmp_path, "seed=5")
    kept = {p: sha256_file(p) for p in (own.dir / "out.bin", own.extra[0] / "model.bin")}
    with pytest.raises(SystemExit) as e:
        cli.main(["runs", "rm", f"smoke/a@{other.key}", "--run-dir", str(tmp_path)])
    assert e.value.code == 0 and "removed" in capsys.readouterr().out
    assert not other.dir.exists() and not other.extra[0].exists()
    assert {p: sha256_file(p) for p in kept} == kept and [r.name for r in stored_runs(tmp_path)] == ["smoke/a"]


@pytest.mark.parametrize("name", ["smoke/nothing", "../elsewhere", "smoke"])
def test_runs_rm_of_what_is_no_run_is_one_line_and_removes_nothing(tmp_path, capsys, name):
    own = _finished(tmp_path)
    with pytest.raises(RunNotFoundError):
        remove_run(tmp_path, name)
    with pytest.raises(SystemExit) as e:
        cli.main(["runs", "rm", name, "--run-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("ctrls runs: ")
    assert own.is_done()


@pytest.mark.integration
@requires_data
def test_an_exploration_under_an_override_is_stored_beside_the_profiles_and_listed(tiny_runs, tmp_path):
    from ctrls.config.schema import override
    from ctrls.stages.exploration import explore, load_samples, samples_dir

    src, cfg, _ = tiny_runs
    shutil.copytree(src / "smoke", tmp_path / "smoke")
    own = override(cfg, [f"run_dir={tmp_path}"])
    book = {p: sha256_file(p) for p in sorted((tmp_path / "smoke").rglob("*")) if p.is_file()}
    other = override(own, ["grid.n_samples=1"])
    out = explore(other, progress=False)
    assert out == samples_dir(other) and out.parent.name.startswith("exploration@")
    assert {p: sha256_file(p) for p in book} == book  # the profile's run and its files: unchanged
    assert samples_dir(own) == tmp_path / "smoke" / "exploration" / "samples.parquet"
    mine = pd.read_parquet(out)  # pandas reads the folder of parts whole
    assert len(mine) == len(load_samples(other)) and mine.sample_index.max() == 0
    assert len(pd.read_parquet(samples_dir(own))) == len(load_samples(own))
    runs = {r.name: r for r in stored_runs(tmp_path, "smoke")}
    beside = runs[f"smoke/{out.parent.name}"]
    assert "grid.n_samples=1" in beside.overrides and "grid.n_samples=1" not in runs["smoke/exploration"].overrides
    assert beside.finished and runs["smoke/exploration"].finished
