"""ctrls.stages.common: which of a stage's files a reader takes as this config's (``current_outputs``: only
what the finished stage's done marker recorded under this config's key; not run, another config's and
unfinished stages refused naming why), and the result reader that names the file and the column holding NaN."""
import errno
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ctrls.stages.common import (
    NotRunError,
    UnreadableResultsError,
    _not_finite,
    current_outputs,
    only_current,
    read_results,
)
from ctrls.stages.runs import Stage
from tests.stages.test_runs_missing import cfg_at


def test_a_recorded_file_that_is_missing_makes_the_stage_unreadable(tmp_path):
    st = Stage(cfg_at(tmp_path), "a", ("seed",)).begin()
    for name in ("q1.parquet", "q2.parquet"):
        (st.dir / name).write_text(name)
    st.finish()
    assert current_outputs(st, "results") == {st.dir / "q1.parquet", st.dir / "q2.parquet"}
    (st.dir / "q2.parquet").unlink()
    with pytest.raises(UnreadableResultsError) as e:
        current_outputs(Stage(cfg_at(tmp_path), "a", ("seed",)), "results")
    assert e.value.path == st.dir / "q2.parquet" and "missing" in str(e.value)
    assert not Stage(cfg_at(tmp_path), "a", ("seed",)).is_done()  # and a rerun redoes it


def test_only_the_finished_stages_recorded_files_of_this_config_are_current(tmp_path):
    a = Stage(cfg_at(tmp_path), "a", ("seed",))
    with pytest.raises(NotRunError, match=r"no results in .*: the a stage has not run"):
        current_outputs(a, "results")
    a.begin()
    (a.dir / "q1.parquet").write_text("1")
    with pytest.raises(NotRunError, match="has not finished for this config"):
        current_outputs(a, "results")
    assert current_outputs(a, "results", unfinished=True) is None  # the stage itself reads its parts: all of them
    a.finish()
    (a.dir / "stray.parquet").write_text("written after the stage finished")
    assert current_outputs(a, "results") == {a.dir / "q1.parquet"}
    other = Stage(_other_seed(tmp_path), "a", ("seed",))  # the same stage under another seed: its own slot, beside
    assert other.dir == a.dir.with_name(f"a@{other.key}") and other.key != a.key
    with pytest.raises(NotRunError, match=r"the a stage has not run"):
        current_outputs(other, "results")
    other.plain, other.dir = a.dir, a.dir  # read from the other config's directory all the same: refused
    with pytest.raises(NotRunError, match=r"made under another config .* run the a stage with this config"):
        current_outputs(other, "results")


def _other_seed(tmp_path):
    from ctrls.config.schema import load_config

    return load_config("smoke", [f"run_dir={tmp_path}", "seed=1"])


def test_only_current_keeps_the_allowed_files_and_logs_the_others(tmp_path, caplog):
    files = [tmp_path / "a", tmp_path / "sub" / ".." / "b", tmp_path / "c"]
    assert only_current(files, None) == files
    with caplog.at_level(logging.WARNING, logger="ctrls.stages.common"):
        kept = only_current(files, {tmp_path / "a", tmp_path / "b"})
    assert kept == files[:2]  # compared after normalising the path
    assert "1 file(s) the finished stage did not record are not read" in caplog.text and str(tmp_path / "c") in caplog.text


@pytest.mark.parametrize("value,missing", [(None, True), (math.nan, True), (math.inf, True), (-math.inf, True),
                                           (np.float32("nan"), True), (pd.NA, True), ([1.0, math.nan], True),
                                           (np.array([1.0, np.inf]), True), (0.0, False), (3, False), ("text", False),
                                           ([1, 2], False), (np.array([0.5]), False), (["a", "b"], False)])
def test_a_missing_result_cell_is_none_nan_or_infinite(value, missing):
    assert _not_finite(value) is missing


def test_results_holding_nan_or_lacking_a_column_are_unreadable_naming_the_file(tmp_path):
    f = tmp_path / "r.parquet"
    pd.DataFrame({"config": ["Base", "eps=0.1", "eps=0.1"], "correct": [1.0, math.nan, math.nan],
                  "accuracy": [[1.0], [0.5], [1.0]]}).to_parquet(f)
    assert len(read_results(f, ("accuracy",))) == 3
    with pytest.raises(UnreadableResultsError, match=r"r\.parquet is unreadable: NaN in column 'correct' \(2 of 3 rows\)") as e:
        read_results(f, ("config", "correct"))
    assert e.value.path == f
    assert len(read_results(f, ("correct",), rows=lambda df: df[df.config == "Base"])) == 3  # only the selected rows
    with pytest.raises(UnreadableResultsError, match="no column 'seed'"):
        read_results(f, ("seed",))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not a parquet file")
    with pytest.raises(UnreadableResultsError, match=r"bad\.parquet is unreadable"):
        read_results(bad)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full: a device whose every write is ENOSPC")
def test_a_full_disk_in_a_torch_save_is_a_run_dir_error_naming_the_file(tmp_path):
    """torch's own writer reports a full disk as "unexpected pos"; save_torch's is one RunDirError naming the file."""
    import torch

    from ctrls.stages.common import save_torch
    from ctrls.stages.runs import RunDirError

    with pytest.raises(RunDirError, match="cannot write /dev/full: no space left on the device"):
        save_torch({"a": torch.zeros(100_000)}, "/dev/full")
    save_torch({"a": torch.arange(3)}, tmp_path / "x.pt")
    assert torch.load(tmp_path / "x.pt", weights_only=True)["a"].tolist() == [0, 1, 2]


def _full_disk(*a, **k):
    """What pyarrow and Python raise writing to a full disk: OS error 28, no file named."""
    raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")


@pytest.mark.parametrize("kind", ["parquet", "arrow table", "json"])
def test_a_full_disk_writing_a_stage_file_is_a_run_dir_error_naming_it_and_keeps_the_old_file(tmp_path, monkeypatch, kind):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrls.stages.common import save_json, save_parquet
    from ctrls.stages.runs import RunDirError

    path = tmp_path / ("x.json" if kind == "json" else "x.parquet")
    df = pd.DataFrame({"a": [1, 2]})
    save = {"parquet": lambda: save_parquet(df, path), "arrow table": lambda: save_parquet(pa.Table.from_pandas(df), path),
            "json": lambda: save_json({"a": [1, 2]}, path)}[kind]
    save()
    before = path.read_bytes()
    monkeypatch.setattr(pd.DataFrame, "to_parquet", _full_disk)
    monkeypatch.setattr(pq, "write_table", _full_disk)
    monkeypatch.setattr(Path, "write_text", _full_disk)
    with pytest.raises(RunDirError, match=f"cannot write {path}: no space left on the device"):
        save()
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left


def test_a_stage_json_holding_a_non_finite_number_is_refused_naming_the_file(tmp_path):
    import json

    from ctrls.stages.common import save_json

    with pytest.raises(ValueError, match=r"x\.json: not written: .*non-finite"):
        save_json({"tau": float("nan")}, tmp_path / "x.json")
    assert not list(tmp_path.iterdir())
    save_json({"tau": 0.5, "notes": ["é"]}, tmp_path / "x.json", indent=1)
    assert json.loads((tmp_path / "x.json").read_text()) == {"tau": 0.5, "notes": ["é"]}


def test_the_stages_write_parquet_and_json_only_through_the_shared_helpers():
    """A stage's parquet or JSON written directly would report a full disk naming the run dir, not the file."""
    import re

    stages = Path(__file__).resolve().parents[2] / "ctrls" / "stages"
    direct = re.compile(r"\.to_parquet\(|pq\.write_table\(|json\.dump\(|\.write_text\(")
    found = [f"{p.name}:{i}" for p in sorted(stages.glob("*.py")) if p.name not in ("common.py", "runs.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if direct.search(line)]
    assert found == []


def test_a_dataset_smaller_than_asked_names_the_key_and_the_most_there_are(tmp_path):
    import json

    from ctrls.config.schema import load_config
    from ctrls.data.problems import DataError
    from ctrls.stages.common import problems_from_config

    d = tmp_path / "mine"
    d.mkdir()
    for split in ("train", "test"):
        (d / f"{split}.jsonl").write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": i + 1}) + "\n"
                                                  for i in range(3)))
    cfg = load_config("smoke", [f"run_dir={tmp_path}", f"grid.datasets=[{d}]", "data.n_train=5", "data.n_test=2"])
    with pytest.raises(DataError, match=r"only 3 exist: data.n_train asks .* \(-o data.n_train=3\)"):
        problems_from_config(cfg, "train")
    assert len(problems_from_config(cfg, "test")) == 2
