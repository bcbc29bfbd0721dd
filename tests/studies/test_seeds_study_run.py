"""studies/seeds_study.py run: each seed's stages in lanes, stored once; with --lockstep-rl the seeds' RL
stages run together after every seed's pretraining and exploration, then each seed is stored."""
from __future__ import annotations

import sys
import types

import pytest

from tests.studies.harness import load_study


@pytest.fixture
def study(tmp_path, monkeypatch):
    mod = load_study("seeds_study")
    monkeypatch.setattr(mod, "OUT", tmp_path / "results")
    calls = []
    monkeypatch.setattr(mod, "run_seed", lambda s, root, threads, stages=("pretrain", "exploration", "rl"), store=True:
                        (calls.append(("stages", s, tuple(stages), store)), {"seed": s, "seconds": 0})[1])
    monkeypatch.setattr(mod, "collect", lambda s, root: calls.append(("store", s)))
    monkeypatch.setattr(mod, "config", lambda s, root: f"config of {s}")
    fake = types.ModuleType("ctrls.stages.rl")
    fake.run_rl_lockstep = lambda cfgs, progress=True: calls.append(("rl in lockstep", tuple(cfgs)))
    monkeypatch.setitem(sys.modules, "ctrls.stages.rl", fake)
    return mod, calls


def test_lockstep_rl_trains_the_seeds_together_after_their_pretraining(study, tmp_path):
    mod, calls = study
    mod.run([100, 101], tmp_path, lanes=1, threads=1, lockstep_rl=True)
    assert calls == [("stages", 100, ("pretrain", "exploration"), False), ("stages", 101, ("pretrain", "exploration"), False),
                     ("rl in lockstep", ("config of 100", "config of 101")), ("store", 100), ("store", 101)]


def test_without_lockstep_each_seed_runs_every_stage_and_is_stored_alone(study, tmp_path):
    mod, calls = study
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "seed_101.json").write_text("{}")  # a stored seed is not run again
    mod.run([100, 101], tmp_path, lanes=1, threads=1)
    assert calls == [("stages", 100, ("pretrain", "exploration", "rl"), True)]
