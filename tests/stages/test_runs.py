"""Run directories (ctrls.stages.runs): a finished stage records the sha256 of its outputs and a rerun
verifies them; loads name the file they could not read; the collection JSONL's commit protocol."""
import hashlib
import json
import logging
import os

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from ctrls.config.schema import ConfigError, load_config
from ctrls.stages.collect import _done_questions, _drop_uncommitted, read_trajectories
from ctrls.stages.runs import (
    ArtifactError,
    Stage,
    check_safetensors,
    load_torch,
    read_parquet,
    sha256_file,
    unify_parts,
    valid_part,
)


def cfg_at(tmp_path):
    return load_config("smoke", [f"run_dir={tmp_path}"])


def finished_stage(tmp_path, name="a", inputs=(), extra=()):
    st = Stage(cfg_at(tmp_path), name, ("seed",), inputs=inputs, extra=extra).begin()
    (st.dir / "sub").mkdir()
    (st.dir / "x.bin").write_bytes(b"x" * 5000)
    (st.dir / "sub" / "y.txt").write_text("why")
    (st.dir / "left.tmp").write_text("a temp file left by a kill")
    st.finish(rows=2)
    return st


def test_finish_records_the_sha256_of_every_output(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "w.bin").write_bytes(b"weights")
    st = finished_stage(tmp_path, extra=(ckpt,))
    rec = json.loads(st.done_file.read_text())
    assert rec["files"] == {"x.bin": hashlib.sha256(b"x" * 5000).hexdigest(),
                            "sub/y.txt": hashlib.sha256(b"why").hexdigest(),
                            "../../ckpt/w.bin": hashlib.sha256(b"weights").hexdigest()}
    assert rec["rows"] == 2 and st.summary()["rows"] == 2 and "files" not in st.summary()
    again = Stage(cfg_at(tmp_path), "a", ("seed",), extra=(ckpt,))
    assert again.is_done()


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "extra"])
def test_a_damaged_output_makes_the_stage_run_again(tmp_path, caplog, damage):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "w.bin").write_bytes(b"weights" * 100)
    st = finished_stage(tmp_path, extra=(ckpt,))
    bad = st.dir / "x.bin" if damage != "extra" else ckpt / "w.bin"
    if damage == "truncate":
        bad.write_bytes(b"x" * 4000)
    elif damage == "flip":
        bad.write_bytes(b"x" * 2500 + b"y" + b"x" * 2499)  # same size, one byte changed
    elif damage == "delete":
        bad.unlink()
    else:
        bad.write_bytes(b"weights" * 99)
    again = Stage(cfg_at(tmp_path), "a", ("seed",), extra=(ckpt,))
    with caplog.at_level(logging.WARNING, logger="ctrls.stages.runs"):
        assert not again.is_done()
    assert str(bad) in caplog.text and str(bad) in " ".join(again.problems)
    again.begin()  # the stage runs again: the bad file and the done marker are gone, the rest stays
    assert not bad.exists() and not again.done_file.exists()
    assert (st.dir / "sub" / "y.txt").read_text() == "why"
    assert not Stage(cfg_at(tmp_path), "a", ("seed",), extra=(ckpt,)).is_done()


def test_an_untouched_stage_is_reused_and_not_rewritten(tmp_path):
    st = finished_stage(tmp_path)
    again = Stage(cfg_at(tmp_path), "a", ("seed",))
    assert again.is_done() and again.problems == [] and again.bad == []
    assert (st.dir / "x.bin").read_bytes() == b"x" * 5000


def test_a_marker_without_checksums_is_not_trusted(tmp_path, caplog):
    """A truncated output behind a marker without checksums is redone."""
    st = finished_stage(tmp_path)
    rec = json.loads(st.done_file.read_text())
    del rec["files"], rec["inputs"]
    st.done_file.write_text(json.dumps(rec))
    (st.dir / "x.bin").write_bytes(b"")
    again = Stage(cfg_at(tmp_path), "a", ("seed",))
    with caplog.at_level(logging.WARNING, logger="ctrls.stages.runs"):
        assert not again.is_done()
    assert "cannot be verified" in caplog.text
    again.begin()  # cleared: nothing of the unverifiable outputs is reused
    assert not (st.dir / "x.bin").exists() and not again.done_file.exists()


def test_an_output_replaced_by_a_directory_is_named_and_redone(tmp_path, caplog):
    """No IsADirectoryError in Stage.begin."""
    st = finished_stage(tmp_path)
    (st.dir / "x.bin").unlink()
    (st.dir / "x.bin").mkdir()
    (st.dir / "x.bin" / "inner").write_text("?")
    again = Stage(cfg_at(tmp_path), "a", ("seed",))
    with caplog.at_level(logging.WARNING, logger="ctrls.stages.runs"):
        assert not again.is_done()
    assert str(st.dir / "x.bin") in caplog.text and "directory" in " ".join(again.problems)
    again.begin()
    assert not (st.dir / "x.bin").exists() and (st.dir / "sub" / "y.txt").read_text() == "why"
    (st.dir / "x.bin").write_bytes(b"x" * 5000)
    again.finish()
    assert Stage(cfg_at(tmp_path), "a", ("seed",)).is_done()


def test_a_done_marker_cannot_make_a_rerun_delete_outside_the_run_dir(tmp_path, caplog):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    runs = tmp_path / "runs"
    st = finished_stage(runs)
    rec = json.loads(st.done_file.read_text())
    rec["files"][os.path.relpath(outside, st.dir)] = "0" * 64  # a wrong checksum for a file outside
    st.done_file.write_text(json.dumps(rec))
    again = Stage(cfg_at(runs), "a", ("seed",))
    with caplog.at_level(logging.WARNING, logger="ctrls.stages.runs"):
        assert not again.is_done()
    assert f"{st.done_file} is corrupt" in caplog.text and "not an output inside the stage directory" in caplog.text
    again.begin()
    assert outside.read_text() == "keep me"


@pytest.mark.parametrize("profile", ["/abs/elsewhere", "../../x", "..", "a/b"])
def test_a_profile_that_is_a_path_is_refused(tmp_path, profile):
    """`-o profile=/some/dir` moved stage directories outside run_dir."""
    with pytest.raises(ConfigError, match="profile"):
        load_config("smoke", [f"run_dir={tmp_path}", f"profile={profile}"])


def test_a_stage_outside_the_run_dir_is_refused_before_anything_is_deleted(tmp_path):
    victim = tmp_path / "victim"
    (victim / "a").mkdir(parents=True)
    (victim / "a" / "data").write_text("keep me")
    cfg = cfg_at(tmp_path / "runs")
    cfg.profile = str(victim)  # set in code, past the config's checks
    with pytest.raises(ConfigError, match="outside the run directory"):
        Stage(cfg, "a", ("seed",)).begin(force=True)
    with pytest.raises(ConfigError, match="outside the run directory"):
        Stage(cfg_at(tmp_path / "runs"), "a", ("seed",), extra=(tmp_path / "victim",))
    assert (victim / "a" / "data").read_text() == "keep me"


def test_a_stage_runs_again_when_its_input_was_redone_with_other_outputs(tmp_path):
    cfg = cfg_at(tmp_path)
    up = finished_stage(tmp_path, "up")
    down = Stage(cfg, "down", ("seed",), inputs=(up,)).begin()
    (down.dir / "out").write_text("from up")
    down.finish()
    assert Stage(cfg, "down", ("seed",), inputs=(Stage(cfg, "up", ("seed",)),)).is_done()

    # the input redone with the same outputs: the downstream stage stays valid
    up2 = Stage(cfg, "up", ("seed",)).begin()
    up2.finish(rows=2)
    assert Stage(cfg, "down", ("seed",), inputs=(up2,)).is_done()
    # unfinished input, then redone with other outputs: the downstream stage must run again
    up3 = Stage(cfg, "up", ("seed",)).begin()
    assert not Stage(cfg, "down", ("seed",), inputs=(up3,)).is_done()
    (up3.dir / "x.bin").write_bytes(b"other")
    up3.finish(rows=2)
    assert not Stage(cfg, "down", ("seed",), inputs=(up3,)).is_done()


# ---- loads that name the file --------------------------------------------------------------


def truncate(path, keep=0.5):
    b = path.read_bytes()
    path.write_bytes(b[: int(len(b) * keep)])


def test_loads_of_truncated_files_name_the_file(tmp_path):
    pt, pq, st = tmp_path / "a.pt", tmp_path / "b.parquet", tmp_path / "c.safetensors"
    torch.save({"t": torch.randn(50, 50)}, pt)
    pd.DataFrame({"a": range(100)}).to_parquet(pq)
    save_file({"t": torch.randn(50, 50)}, str(st))
    assert load_torch(pt)["t"].shape == (50, 50) and len(read_parquet(pq)) == 100
    check_safetensors(st)
    for f in (pt, pq, st):
        truncate(f)
    for load, f in ((load_torch, pt), (read_parquet, pq), (check_safetensors, st)):
        with pytest.raises(ArtifactError, match=f"cannot read {f}.*truncated or corrupt"):
            load(f)
    with pytest.raises(ArtifactError, match=f"{tmp_path / 'none.pt'} is missing"):
        load_torch(tmp_path / "none.pt")


def test_valid_part(tmp_path, caplog):
    p = tmp_path / "part.parquet"
    assert not valid_part(p, 4)  # missing: not reusable, nothing to say
    pd.DataFrame({"a": range(4)}).to_parquet(p)
    assert valid_part(p, 4)
    with caplog.at_level(logging.WARNING, logger="ctrls.stages.runs"):
        assert not valid_part(p, 5)
        truncate(p, 0.9)
        assert not valid_part(p, 4)
    assert caplog.text.count(str(p)) == 2


def test_sha256_file_streams_large_files(tmp_path):
    p = tmp_path / "big"
    data = bytes(range(256)) * 10_000  # 2.5 MB: several 1 MiB chunks
    p.write_bytes(data)
    assert sha256_file(p, chunk=1 << 20) == hashlib.sha256(data).hexdigest()


# ---- the collection JSONL: a question's rows, then its `_end` row, which commits it ---------------


def q_rows(qid, n=2):
    rows = [{"qid": qid, "source": "samples", "sample_index": i, "solution_ids": [1, 2], "steps": ["s"],
             "valid": True, "correct": i == 0, "pred": "1", "kept": i == 0, "finish": "eos"} for i in range(n)]
    rows.append({"qid": qid, "source": "reference", "sample_index": -1, "solution_ids": [3], "steps": ["r"],
                 "valid": True, "correct": True, "pred": "1", "kept": True, "finish": "reference"})
    return rows + [{"qid": qid, "source": "_end", "sample_index": -2}]


def write_rows(path, rows, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_uncommitted_rows_are_cut_off_and_not_read(tmp_path):
    path = tmp_path / "t.jsonl"
    committed = q_rows("q1") + q_rows("q2")
    write_rows(path, committed)
    whole = path.read_bytes()
    # killed while writing q3: two whole rows and half a line
    write_rows(path, committed + q_rows("q3")[:2], tail='{"qid": "q3", "sou')
    df = read_trajectories(path)
    assert list(df.qid) == ["q1"] * 3 + ["q2"] * 3 and _done_questions(path) == {"q1", "q2"}
    _drop_uncommitted(path)
    assert path.read_bytes() == whole
    _drop_uncommitted(path)  # nothing to cut: unchanged
    assert path.read_bytes() == whole


def test_rows_left_by_older_resumes_count_once(tmp_path):
    """A file resumed by the old protocol: the cut rows of q2 (and a stray row of q3) stayed in, then
    q2 was appended again."""
    path = tmp_path / "t.jsonl"
    write_rows(path, q_rows("q1") + q_rows("q2")[:2] + q_rows("q3", n=3)[2:3] + q_rows("q2") + q_rows("q3", n=3))
    df = read_trajectories(path)
    assert len(df) == 3 + 3 + 4 and not df.duplicated(["qid", "source", "sample_index"]).any()
    assert (df.source == "samples").sum() == 2 + 2 + 3  # not 10
    assert list(df.qid) == ["q1"] * 3 + ["q2"] * 3 + ["q3"] * 4


def test_a_corrupt_line_inside_a_committed_question_is_an_error(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = q_rows("q1")
    path.write_text(json.dumps(rows[0]) + "\n" + "{not json\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))
    with pytest.raises(ArtifactError, match=f"{path}, line 2: not a JSON row"):
        read_trajectories(path)


def test_questions_whose_ids_differ_in_punctuation_never_share_a_run_file(tmp_path):
    """ids "a b", "a_b" and "a?b" shared one exploration part and one feature shard,
    so exploration kept 6 samples of 1 question instead of 18 of 3, and pretraining trained on 2 of 3."""
    from ctrls.stages.collect import shard_file
    from ctrls.stages.exploration import part_file

    ids = ["own-test-a b", "own-test-a_b", "own-test-a?b", "own-test-A_B"]
    parts = {part_file(tmp_path, "m", "d", 0.7, "fixed s0", q).name.casefold() for q in ids}
    shards = {shard_file(tmp_path, q).name.casefold() for q in ids}
    assert len(parts) == len(shards) == len(ids)
    assert part_file(tmp_path, "m", "d", 0.7000001, "Base", "q") != part_file(tmp_path, "m", "d", 0.7000002, "Base", "q")


def test_a_full_disk_is_a_run_dir_error_naming_the_file(tmp_path, monkeypatch):
    """A write that meets ENOSPC (an OSError, or safetensors' own error reporting OS error 28) is a RunDirError
    naming the file and saying what to do; any other failure passes through unchanged."""
    import errno

    import safetensors.torch
    import torch

    from ctrls.stages.runs import RunDirError, writing

    target = tmp_path / "vectors.safetensors"
    with pytest.raises(RunDirError, match="no space left.*vectors.safetensors|vectors.safetensors.*no space left"):
        with writing(target):
            raise OSError(errno.ENOSPC, "No space left on device", str(target))

    def full(*a, **k):
        raise RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                           "\"No space left on device\" })")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(RunDirError, match="another disk"):
        with writing(target):
            safetensors.torch.save_file({"v": torch.zeros(1)}, str(target))
    with pytest.raises(ValueError, match="other"):
        with writing(target):
            raise ValueError("other")


def test_a_refused_check_leaves_a_fresh_stage_without_a_directory_and_its_lock_free(tmp_path):
    from tests.stages.test_locks import free

    class Missing(RuntimeError):
        pass

    def refuse():
        raise Missing("no fit")

    st = Stage(cfg_at(tmp_path), "a", ("seed",))
    with pytest.raises(Missing):
        st.begin(check=refuse)
    assert not st.dir.exists() and free(st.lock_file)


def test_a_run_of_another_config_is_stored_beside_and_leaves_the_first_unchanged(tmp_path):
    first = Stage(cfg_at(tmp_path), "a", ("seed",), extra=(tmp_path / "smoke" / "ckpt",)).begin()
    (first.dir / "out.bin").write_bytes(b"the profile's")
    first.extra[0].write_bytes(b"the profile's checkpoint")
    first.finish()
    before = {p: sha256_file(p) for p in (first.dir / "out.bin", first.extra[0])}
    other = Stage(load_config("smoke", [f"run_dir={tmp_path}", "seed=5"]), "a", ("seed",),
                  extra=(tmp_path / "smoke" / "ckpt",))
    assert other.key != first.key and other.dir == first.dir.with_name(f"a@{other.key}")
    assert other.extra == (tmp_path / "smoke" / f"ckpt@{other.key}",) and other.slot == f"@{other.key}"
    other.begin(force=True)  # even forced: only its own slot is cleared
    (other.dir / "out.bin").write_bytes(b"another config's")
    other.extra[0].write_bytes(b"its checkpoint")
    other.finish()
    assert {p: sha256_file(p) for p in before} == before
    assert Stage(cfg_at(tmp_path), "a", ("seed",), extra=(tmp_path / "smoke" / "ckpt",)).is_done()
    again = Stage(load_config("smoke", [f"run_dir={tmp_path}", "seed=5"]), "a", ("seed",), extra=(tmp_path / "smoke" / "ckpt",))
    assert again.dir == other.dir and again.is_done()


def test_parts_with_a_column_null_in_some_are_unified_for_pandas(tmp_path):
    d = tmp_path / "samples.parquet"
    d.mkdir()
    pd.DataFrame({"q": ["a"], "pred": [None], "states": [[]]}).to_parquet(d / "a.parquet")
    pd.DataFrame({"q": ["b"], "pred": ["7"], "states": [[1, 2]], "n_tokens": [3]}).to_parquet(d / "b.parquet")
    pd.DataFrame({"q": ["c"], "pred": [None], "states": [[]]}).to_parquet(d / "c.parquet")
    with pytest.raises(Exception):
        pd.read_parquet(d)  # null-typed columns in the first part: pyarrow cannot cast the others to them
    b = sha256_file(d / "b.parquet")
    assert unify_parts(d) == 2 and sha256_file(d / "b.parquet") == b  # only the parts of another schema
    df = pd.read_parquet(d)
    by_q = df.set_index("q")
    assert sorted(df.q) == ["a", "b", "c"] and by_q.pred["b"] == "7" and by_q.pred[["a", "c"]].isna().all()
    assert list(by_q.states["b"]) == [1, 2] and df.n_tokens.isna().sum() == 2
    assert unify_parts(d) == 0
