"""bench/seeds.py's seed budget: a seed's stage seconds alone and in lockstep, from the stored results."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import seeds  # noqa: E402


def _store(root: Path, pretrain: list[dict], explore: list[float], rl: list[float]) -> None:
    d = root / "studies/results/seeds_study"
    d.mkdir(parents=True)
    for i, (p, e, r) in enumerate(zip(pretrain, explore, rl)):
        (d / f"seed_{i}.json").write_text(json.dumps({"stage_seconds": {"pretrain": p, "exploration": e, "rl": r},
                                                      "machine": {"gemm_gflops": 50.0 + i}}))
    (root / "bench/results").mkdir(parents=True)
    (root / "bench/results/rl_lockstep.json").write_text(json.dumps({"results": [{"runs": 4, "speedup": 2.5}]}))


def test_the_budget_divides_only_the_shared_stages_by_their_measured_ratios(tmp_path, monkeypatch):
    # two seeds whose means are collect 100, features 50, state_prompt 300, exploration 200, rl 350
    pre = [{"collect": 90, "features": 50, "state_prompt": 280}, {"collect": 110, "features": 50, "state_prompt": 320}]
    _store(tmp_path, pre, [150, 250], [300, 400])
    monkeypatch.setattr(seeds, "ROOT", tmp_path)
    res = {"workloads": {"exploration": {"results": [{"runs": 8, "speedup": 1.25}, {"runs": 2, "speedup": 9.0}]}}}
    b = seeds.seed_budget(res)
    # by hand: 100/1.25 + 50 + 300 + 200/1.25 + 350/2.5 = 730 of 1000 alone
    assert b["seconds_per_seed_alone"] == 1000.0 and b["projected_seconds_per_seed_lockstep_8"] == 730.0
    assert b["projected_lockstep_speedup_8"] == pytest.approx(1000 / 730, abs=1e-3)
    assert b["bound_lockstep_speedup"] == pytest.approx(1000 / 550, abs=1e-3)  # RL and collection free
    assert b["arithmetic_bound_share"] == 0.55 and b["gemm_gflops_mean"] == 50.5 and b["seeds"] == 2


def test_without_the_lockstep_size_the_budget_keeps_the_bound_and_names_the_missing_projection(tmp_path, monkeypatch):
    _store(tmp_path, [{"collect": 30.0, "state_prompt": 60.0}], [10.0], [100.0])
    monkeypatch.setattr(seeds, "ROOT", tmp_path)
    b = seeds.seed_budget({"workloads": {"exploration": {"results": [{"runs": 4, "speedup": 1.1}]}}})
    assert b["bound_lockstep_speedup"] == pytest.approx(200 / 70, abs=1e-3)  # 200 s alone, 70 s not shared
    assert "S = 8" in b["projection"] and "projected_lockstep_speedup_8" not in b
