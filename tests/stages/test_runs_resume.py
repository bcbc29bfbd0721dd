"""Kill and resume, and damaged files, compared artifact by artifact with an uninterrupted run.

Each stage (pretraining's collection, the exploration grid, RL) is interrupted at a point inside
it, by an exception raised from a monkeypatched function (what a kill leaves on disk: everything
written before that point, nothing after), then rerun. Every artifact of the resumed run must equal
the uninterrupted run's (parquet rows equal with floats at rtol 1e-4, other files byte for byte),
as in test_distributed.py. Then files of finished stages are truncated: a rerun must name each
one, redo it, and again give the uninterrupted run's artifacts.

The RL Trainer's own resume paths (an unusable checkpoint, a curve left behind by a kill between
the checkpoint and the curve) are checked first, on the synthetic MDP of test_rl.py.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import SMOKE_OVERRIDES, requires_data, tiny_overrides

from ctrls.config.schema import load_config
from ctrls.config.settings import Setting
from ctrls.method.policy import TransitionPolicy
from ctrls.stages.collect import kept_trajectories
from ctrls.stages.trainer import Trainer
from tests.method.test_reinforce import K, cfg_for, mdp_sampler


class Killed(BaseException):
    """Stands for a kill: no `except Exception` in the code under test catches it."""


def truncate(path: Path, keep: float = 0.6) -> None:
    b = path.read_bytes()
    path.write_bytes(b[: int(len(b) * keep)])


# ---- the RL Trainer on the MDP (unit) ----------------------------------------------------------


def mdp_trainer(out, cfg):
    pol = TransitionPolicy(K, concentration=5.0)
    return Trainer(pol, cfg, Setting("x", 0.1, 0.01), 0, out, mdp_sampler(pol), 1)


def test_an_unusable_rl_checkpoint_is_named_and_the_run_redone(tmp_path, caplog):
    cfg = cfg_for(steps=4, checkpoint_every=2)
    full = mdp_trainer(tmp_path / "full", cfg)
    full.run(4, progress=False)

    cut = mdp_trainer(tmp_path / "cut", cfg)
    cut.run(2, progress=False)
    truncate(cut.ckpt)
    with caplog.at_level(logging.WARNING, logger="ctrls.method.reinforce"):
        again = mdp_trainer(tmp_path / "cut", cfg)
    assert f"RL checkpoint {cut.ckpt} is unusable" in caplog.text
    assert again.step == 0 and again.log == []
    again.run(4, progress=False)
    pd.testing.assert_frame_equal(pd.DataFrame(full.log), pd.DataFrame(again.log))
    assert torch.equal(full.policy.L, again.policy.L)
    pd.testing.assert_frame_equal(pd.read_parquet(full.curve_file), pd.read_parquet(again.curve_file))


@pytest.mark.parametrize("damage", ["delete", "truncate", "stale"])
def test_a_curve_behind_its_checkpoint_is_rewritten_on_resume(tmp_path, caplog, damage):
    """A kill between writing checkpoint.pt and curve.parquet leaves the curve one save behind."""
    cfg = cfg_for(steps=4, checkpoint_every=2)
    tr = mdp_trainer(tmp_path / "run", cfg)
    tr.run(2, progress=False)
    stale = tr.curve_file.read_bytes()
    tr.run(4, progress=False)
    whole = tr.curve_file.read_bytes()
    if damage == "delete":
        tr.curve_file.unlink()
    elif damage == "truncate":
        truncate(tr.curve_file)
    else:
        tr.curve_file.write_bytes(stale)
    with caplog.at_level(logging.WARNING):
        again = mdp_trainer(tmp_path / "run", cfg)
    assert again.step == 4 and str(tr.curve_file) in caplog.text
    assert tr.curve_file.read_bytes() == whole


# ---- the real stages on the smoke profile (integration) ------------------------------------------

# One RL run (the Table 2 row), two steps: a kill can fall between. With an entropy bonus, so that the
# policy moves at every step even where no sample is rewarded (the tiny random model answers nothing).
RL_OVR = ["rl.steps=2", "rl.settings=[]", 'rl.table2=["eps=0.1,H=0.01"]', "judge.settings=[]"]
@pytest.fixture(scope="module")
def smoke_cfg(tiny_model_dir):
    """The config of a run directory: the smoke profile on the tiny random-weight model
    (conftest.tiny_model_dir); these tests compare a resumed run with an uninterrupted run of the same
    code, which needs no sensible text."""
    return lambda run_dir: load_config("smoke", [*SMOKE_OVERRIDES, *RL_OVR, *tiny_overrides(tiny_model_dir),
                                                 f"run_dir={run_dir}"])


def pair_cfg(cfg):
    """Pretraining's config: ``cfg``'s first (backbone, dataset) pair."""
    return cfg.for_pair(*cfg.pairs()[0])


def artifacts(root: Path) -> dict[str, Path]:
    skip = {"config.yaml", "done"}  # config.yaml names the run directory; done holds wall times
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in skip and not p.name.endswith(".tmp")}


def summaries(root: Path) -> dict[str, dict]:
    drop = {"wall_s", "files", "inputs", "commit", "finished"}  # when and from which commit: not results
    return {str(p.relative_to(root)): {k: v for k, v in json.loads(p.read_text()).items()
                                       if k not in drop and not k.endswith("_s")}  # timings differ run to run
            for p in sorted(root.rglob("done"))}


def assert_same_object(x, y, where: str) -> None:
    """Equal values, exactly: tensors element for element, containers item for item."""
    assert type(x) is type(y), where
    if isinstance(x, dict):
        assert list(x) == list(y), where
        for k in x:
            assert_same_object(x[k], y[k], f"{where}[{k!r}]")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y)):
            assert_same_object(u, v, f"{where}[{i}]")
    elif isinstance(x, torch.Tensor):
        assert torch.equal(x, y), where
    elif isinstance(x, float) and x != x:
        assert y != y, where  # NaN
    else:
        assert x == y, where


def assert_same_artifacts(ref: Path, got: Path) -> None:
    a, b = artifacts(ref), artifacts(got)
    assert sorted(a) == sorted(b)
    for rel, p in a.items():
        if p.suffix == ".parquet":
            pd.testing.assert_frame_equal(pd.read_parquet(p), pd.read_parquet(b[rel]), check_exact=False,
                                          rtol=1e-4, atol=1e-6, obj=rel)
        elif p.name == "checkpoint.pt":  # an RL checkpoint: a resumed run pickles its log and optimizer state
            # with other object sharing (other bytes), so compare what it holds, exactly
            assert_same_object(torch.load(p, weights_only=True), torch.load(b[rel], weights_only=True), rel)
        else:
            assert p.read_bytes() == b[rel].read_bytes(), rel
    assert summaries(ref) == summaries(got)


def copy_stages(src: Path, dst: Path, *stages: str) -> None:
    for s in stages:
        shutil.copytree(src / "smoke" / s, dst / "smoke" / s)


@pytest.fixture(scope="module")
def reference(tiny_runs, smoke_cfg, tmp_path_factory) -> Path:
    """One uninterrupted run of every stage on the tiny model: the session's pretraining and
    exploration (conftest.tiny_runs), then RL."""
    from ctrls.stages.rl import run_rl

    src, _, _ = tiny_runs
    d = tmp_path_factory.mktemp("uninterrupted")
    copy_stages(src, d, "pretrain", "exploration")
    run_rl(smoke_cfg(d), progress=False)
    return d


@pytest.mark.integration
@requires_data
def test_the_rl_stage_records_where_its_time_went(reference, smoke_cfg):
    """The RL stage's done record times every phase (ctrls.stages.rl.PhaseClock); the parts add up
    to its wall time, decoding dominates, and the reproduce page's table is drawn from them."""
    from ctrls.stages.rl import PHASES, profile_markdown, rl_stage

    cfg = smoke_cfg(reference)
    rec = rl_stage(cfg).summary()
    prof = rec["profile_s"]
    assert list(prof) == [*PHASES, "other"]
    # eval_every=1: every evaluation but the last is drawn with the next step's samples
    assert prof["decode: training samples with evaluation"] > 0 and prof["decode: evaluation"] > 0 and prof["load"] > 0
    assert prof["decode: training samples"] == 0
    assert min(prof.values()) >= 0  # two Adam steps of a 4-state policy: "policy update" rounds to 0.0 s
    assert prof["decode: Table 2 samples"] > 0  # RL_OVR keeps one Table 2 row
    assert sum(prof.values()) == pytest.approx(rec["wall_s"], rel=0.1, abs=1.0)
    md = profile_markdown(cfg)
    assert f"| decode: training samples with evaluation | {prof['decode: training samples with evaluation']:.0f} |" in md
    assert f"took {rec['wall_s']:.0f} s" in md
    empty = smoke_cfg(reference.parent / "never_ran")
    assert "no timed run" in profile_markdown(empty)


@pytest.mark.integration
@requires_data
def test_rl_in_lockstep_with_merged_evaluations_equals_sequential_runs(reference, smoke_cfg, tmp_path):
    """rl.lockstep=false: each run alone, its evaluations decoded apart; the reference's lockstep run drew
    them with the next step's samples (train, test and Base prompts of several policies in one batch)."""
    from ctrls.config.schema import override
    from ctrls.stages.rl import run_rl

    copy_stages(reference, tmp_path, "pretrain", "exploration")
    run_rl(override(smoke_cfg(tmp_path), {"rl.lockstep": False}), progress=False)
    for f in sorted((reference / "smoke" / "rl").rglob("*.parquet")):
        pd.testing.assert_frame_equal(pd.read_parquet(f), pd.read_parquet(tmp_path / f.relative_to(reference)),
                                      check_exact=False, rtol=1e-4, atol=1e-6, obj=str(f.relative_to(reference)))
    assert len(list((reference / "smoke" / "rl").rglob("curve.parquet")))


@pytest.mark.integration
@requires_data
def test_rl_of_two_training_runs_in_lockstep_equals_each_run_alone(reference, smoke_cfg, tmp_path):
    """Two training runs (their own run directories and pretrained models; the second with another RL seed)
    in one lockstep loop, their rows in one batch: each writes the curves and Table 2 samples it writes
    alone, and configs that cannot share the loop are refused before anything begins."""
    from ctrls.config.schema import override
    from ctrls.stages.rl import rl_stage, run_rl, run_rl_lockstep

    other = {"rl.seeds": [7]}
    alone, a, b = tmp_path / "alone", tmp_path / "a", tmp_path / "b"
    for d in (alone, a, b):
        copy_stages(reference, d, "pretrain", "exploration")
    run_rl(override(smoke_cfg(alone), other), progress=False)
    run_rl_lockstep([smoke_cfg(a), override(smoke_cfg(b), other)], progress=False)
    for ref, got in ((reference, a), (alone, b)):
        files = sorted((ref / "smoke" / "rl").rglob("*.parquet"))
        assert files
        for f in files:
            pd.testing.assert_frame_equal(pd.read_parquet(f), pd.read_parquet(got / f.relative_to(ref)),
                                          check_exact=False, rtol=1e-4, atol=1e-6, obj=str(f.relative_to(ref)))
    assert rl_stage(smoke_cfg(a)).summary()["lockstep_configs"] == 2
    cut = pd.read_parquet(next((b / "smoke" / "rl").rglob("curve.parquet")))
    assert not cut.equals(pd.read_parquet(next((a / "smoke" / "rl").rglob("curve.parquet"))))  # two runs, not one
    c = tmp_path / "c"
    with pytest.raises(ValueError, match="rl.steps"):
        run_rl_lockstep([smoke_cfg(c), override(smoke_cfg(tmp_path / "d"), {"rl.steps": 3})], progress=False)
    with pytest.raises(ValueError, match="a run directory each"):
        run_rl_lockstep([smoke_cfg(c), smoke_cfg(c)], progress=False)
    assert not (c / "smoke" / "rl").exists()


@pytest.mark.integration
@requires_data
def test_collection_killed_mid_question_counts_nothing_twice(reference, smoke_cfg, tmp_path, monkeypatch):
    import ctrls.stages.collect as C
    import ctrls.stages.pretrain as P

    real, calls = C.append_jsonl, []

    def killed_after_two_rows(path, rows):
        calls.append(rows)
        if len(calls) == 2:  # the second chunk (questions 3 and 4, 4 rows each: 2 samples, reference, _end):
            # 2 rows of question 3 reach the disk
            real(path, rows[:2])
            raise Killed
        real(path, rows)

    monkeypatch.setattr(C, "append_jsonl", killed_after_two_rows)
    cfg = pair_cfg(smoke_cfg(tmp_path))
    with pytest.raises(Killed):
        P.pretrain(cfg, progress=False)
    assert [len(r) for r in calls] == [8, 8]  # SMOKE_OVERRIDES: 4 sequences, two questions, per sampling chunk
    traj = P.pretrain_stages(cfg)["collect"].dir / "trajectories.jsonl"
    assert len(traj.read_text().splitlines()) == 10
    with open(traj, "a") as f:  # a kill can also cut a line in half (moved from test_pretrain)
        f.write('{"qid": "gsm8k-train-')

    monkeypatch.setattr(C, "append_jsonl", real)
    run = P.pretrain(cfg, progress=False)
    c = run.summaries["collect"]
    assert c["questions"] == 4 and c["sampled"] == 4 * 2  # not 10: the cut question counted once
    key = ["qid", "source", "sample_index"]
    assert not kept_trajectories(run.root / "collect").duplicated(subset=key).any()
    assert_same_artifacts(reference / "smoke" / "pretrain", tmp_path / "smoke" / "pretrain")


@pytest.mark.integration
@requires_data
def test_exploration_killed_mid_grid_gives_the_same_samples(reference, smoke_cfg, tmp_path, monkeypatch, caplog):
    import ctrls.stages.exploration as E

    copy_stages(reference, tmp_path, "pretrain")
    real, written = E.write_part, []

    def killed_at_the_third_part(df, path):
        if len(written) == 2:
            raise Killed
        real(df, path)
        written.append(path)

    monkeypatch.setattr(E, "write_part", killed_at_the_third_part)
    with pytest.raises(Killed):
        E.explore(smoke_cfg(tmp_path), progress=False)
    monkeypatch.setattr(E, "write_part", real)
    truncate(written[1])  # a part cut short on disk must not be reused
    out = E.samples_dir(smoke_cfg(tmp_path))
    (out / "partial.parquet.tmp").write_bytes(b"PAR1 cut")  # nor a half-written temp file (moved from test_exploration)
    with caplog.at_level(logging.WARNING):
        E.explore(smoke_cfg(tmp_path), progress=False)
    assert str(written[1]) in caplog.text
    key = ["temperature", "config", "question_id", "sample_index"]
    assert not E.load_samples(smoke_cfg(tmp_path)).duplicated(key).any()
    assert_same_artifacts(reference / "smoke" / "exploration", tmp_path / "smoke" / "exploration")


@pytest.mark.integration
@requires_data
def test_rl_killed_mid_training_gives_the_same_curve_policy_and_table2(reference, smoke_cfg, tmp_path, monkeypatch):
    import ctrls.stages.trainer as R  # the Trainer moved here from ctrls.method.reinforce
    from ctrls.stages.rl import run_rl

    copy_stages(reference, tmp_path, "pretrain", "exploration")
    real = R.Trainer.update  # both the lockstep and the sequential loop step through it

    def killed_in_step_two(self, plan, trajs):
        if self.step == 1:
            raise Killed
        return real(self, plan, trajs)

    monkeypatch.setattr(R.Trainer, "update", killed_in_step_two)
    with pytest.raises(Killed):
        run_rl(smoke_cfg(tmp_path), progress=False)
    assert not (tmp_path / "smoke" / ".rl.lock").exists()  # a killed run gives the stage's lock back
    ckpts = list((tmp_path / "smoke" / "rl").rglob("checkpoint.pt"))
    assert ckpts and all(torch.load(c, weights_only=True)["step"] == 1 for c in ckpts)
    at_kill = {c: torch.load(c, weights_only=True)["policy"] for c in ckpts}
    monkeypatch.setattr(R.Trainer, "update", real)
    run_rl(smoke_cfg(tmp_path), progress=False)
    for c, pol in at_kill.items():  # the resumed step moved the policy (else equal artifacts would prove little)
        after = torch.load(c, weights_only=True)["policy"]
        assert any(not torch.equal(pol[k], after[k]) for k in pol), c
    assert_same_artifacts(reference / "smoke" / "rl", tmp_path / "smoke" / "rl")


@pytest.mark.integration
@requires_data
def test_damaged_files_of_finished_stages_are_named_and_redone(reference, smoke_cfg, tmp_path, caplog):
    from ctrls.stages.collect import PretrainError
    from ctrls.stages.exploration import explore
    from ctrls.stages.pretrain import load_pretrained, pretrain
    from ctrls.stages.rl import run_rl

    copy_stages(reference, tmp_path, "pretrain", "exploration", "rl")
    root = tmp_path / "smoke"
    damaged = [sorted((root / "pretrain").rglob("features/*.pt"))[1],  # one shard: redone alone
               next((root / "pretrain").rglob("checkpoint/model.safetensors")),  # written by the adapter stage
               sorted((root / "exploration").rglob("*.parquet/*.parquet"))[2],
               next((root / "rl").rglob("curve.parquet"))]  # rewritten from the RL checkpoint's log
    for f in damaged:
        truncate(f)
    with pytest.raises(PretrainError, match=re.escape(f"{damaged[1]} is corrupt")):  # not a safetensors error with no name
        load_pretrained(pair_cfg(smoke_cfg(tmp_path)))
    with caplog.at_level(logging.WARNING):
        pretrain(pair_cfg(smoke_cfg(tmp_path)), progress=False)
        explore(smoke_cfg(tmp_path), progress=False)
        run_rl(smoke_cfg(tmp_path), progress=False)
    for f in damaged:
        assert f"{f} is corrupt" in caplog.text
    assert_same_artifacts(reference / "smoke", root)
