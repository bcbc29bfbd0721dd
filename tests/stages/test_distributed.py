"""Data parallelism (ctrls.stages.distributed): 2 processes on the CPU (gloo), launched by `accelerate launch`,
give the results of one process with the same seed.

- REINFORCE on the synthetic MDP of test_rl.py: the step's trajectory slots split across ranks (one
  question's group straddles the two), gradients all-reduced: the same curve and the same policy.
- The real pipeline on the smoke profile, `ctrls stage pretrain exploration rl`: the collected CoTs,
  every stage artifact downstream of them, the Table 1 samples, the RL curves and the Table 2
  samples equal those of a single process.

Both sides run with OMP_NUM_THREADS=1 (what the launcher gives each rank), so that float reductions
inside one forward pass are the same; what differs is only how the work is split.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import ROOT, requires_data, tiny_overrides

from ctrls.stages.distributed import World

TESTS = Path(__file__).resolve().parent
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def launch_env() -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS.parent), str(TESTS)]))  # conftest is in tests/
    env.pop("WORLD_SIZE", None)
    return env


def check(proc: subprocess.CompletedProcess | subprocess.Popen, out: str = "") -> None:
    assert proc.returncode == 0, out[-6000:]


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_shards_cover_the_items_in_order(size):
    for n in range(0, 12):
        items = list(range(n))
        parts = [World(r, size).shard(items) for r in range(size)]
        assert [x for p in parts for x in p] == items
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


# ---- REINFORCE on the MDP ---------------------------------------------------------------------

SETTINGS = {  # name: (epsilon, alpha, rl overrides)
    "eps_entropy": (0.2, 0.05, {}),
    "group_mean": (0.0, 0.0, {"baseline": "group_mean"}),
}
MDP_STEPS = 12


def train_mdp(out: Path, name: str) -> tuple[pd.DataFrame, dict]:
    """3 questions x 5 trajectories per step on the MDP of test_rl.py; returns the log and the policy."""
    from ctrls.config.settings import Setting
    from ctrls.method.policy import TransitionPolicy
    from ctrls.stages.trainer import Trainer
    from tests.method.test_reinforce import K, cfg_for, mdp_sampler

    eps, alpha, rl = SETTINGS[name]
    cfg = cfg_for(alpha, eps, steps=MDP_STEPS, questions_per_step=3, **{"group_size": 5, **rl})
    torch.manual_seed(0)
    policy = TransitionPolicy(K, concentration=5.0)
    tr = Trainer(policy, cfg, Setting(name, eps, alpha), 7, out / name, mdp_sampler(policy), n_train=4)
    log = tr.run(MDP_STEPS, progress=False)
    return log, {k: v.detach().clone() for k, v in policy.state_dict().items()}


MDP_SCRIPT = """
import sys
from pathlib import Path
import torch
from ctrls.stages.distributed import shutdown, world
from test_distributed import SETTINGS, train_mdp

out = Path(sys.argv[1])
for name in SETTINGS:
    log, state = train_mdp(out, name)
    if world().is_main:
        log.to_parquet(out / f"{name}.log.parquet")
        torch.save(state, out / f"{name}.policy.pt")
print("world size", world().size, flush=True)
shutdown()
"""


def test_reinforce_on_two_processes_equals_one(tmp_path):
    from ctrls.method.policy import TransitionPolicy
    from tests.method.test_reinforce import K

    script = tmp_path / "mdp.py"
    script.write_text(MDP_SCRIPT)
    two = tmp_path / "two"
    two.mkdir()
    r = subprocess.run([*ACCELERATE, str(script), str(two)], env=launch_env(), cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    check(r, r.stdout + r.stderr)
    assert "world size 2" in r.stdout  # really two ranks: only rank 0 prints

    for name in SETTINGS:
        log1, state1 = train_mdp(tmp_path / "one", name)
        log2 = pd.read_parquet(two / f"{name}.log.parquet")
        state2 = torch.load(two / f"{name}.policy.pt")
        assert len(log1) == MDP_STEPS and log1.reward.nunique() > 1  # it trained, on varied rewards
        # summed in another order over ranks: equal up to float rounding
        pd.testing.assert_frame_equal(log1.reset_index(drop=True), log2, check_exact=False, rtol=1e-4, atol=1e-6)
        for k in state1:
            torch.testing.assert_close(state1[k], state2[k], rtol=1e-4, atol=1e-6)
        fresh = TransitionPolicy(K, concentration=5.0).state_dict()
        assert any(not torch.allclose(state1[k], fresh[k]) for k in fresh)  # the policy moved


# ---- the real pipeline ------------------------------------------------------------------------

# the smoke profile made smaller still, on the tiny random-weight model (conftest.tiny_model_dir: the test
# compares two runs of the same code): 2 training and 2 test questions (one per rank), 16 tokens, one RL
# run of one step, with an entropy bonus so that its gradient is not zero where no sample is rewarded
PIPELINE = ["--profile", "smoke", "--quiet", "-o", "sampling.batch_size=2", "sampling.max_new_tokens=16", "data.n_train=2",
            "data.n_test=2",
            "rl.steps=1", "rl.eval_questions=2", "rl.settings=[]", 'rl.table2=["eps=0.1,H=0.01"]', "judge.settings=[]"]


def artifacts(run: Path) -> dict[str, Path]:
    """Every result file of a run, by path relative to the run, less run-specific metadata."""
    skip = {"config.yaml", "done", "config.json"}
    return {str(p.relative_to(run)): p for p in sorted(run.rglob("*")) if p.is_file() and p.name not in skip}


@pytest.mark.integration
@requires_data
def test_pipeline_on_two_processes_equals_one(tmp_path, tiny_model_dir):
    stage = ["-m", "ctrls", "stage", "pretrain", "exploration", "rl"]
    pipeline = [*PIPELINE, *tiny_overrides(tiny_model_dir)]
    one, two = tmp_path / "one", tmp_path / "two"
    # side by side: 3 processes of one thread each on the machine
    procs = [subprocess.Popen([sys.executable, *stage, "--run-dir", str(one), *pipeline], env=launch_env(),
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
             subprocess.Popen([*ACCELERATE, *stage, "--run-dir", str(two), *pipeline], env=launch_env(),
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, out in zip(procs, outs):
        check(p, out)
    assert "rl: " in outs[0] and "(1 process," in outs[0]
    assert "rl: " in outs[1] and "(2 processes," in outs[1]

    a, b = artifacts(one), artifacts(two)
    assert a.keys() == b.keys()
    kinds = {"collect/trajectories.jsonl", "exploration/samples.parquet", "curve.parquet", "table2.parquet"}
    assert all(any(k in f for f in a) for k in kinds), sorted(a)
    for rel, p in a.items():
        q = b[rel]
        if p.suffix == ".parquet":  # same rows, same order; floats summed across ranks may round differently
            pd.testing.assert_frame_equal(pd.read_parquet(p), pd.read_parquet(q), check_exact=False,
                                          rtol=1e-4, atol=1e-6, obj=rel)
        elif rel.endswith("checkpoint.pt") and "/rl/" in f"/{rel}":
            s1, s2 = torch.load(p, weights_only=False), torch.load(q, weights_only=False)
            assert s1["step"] == s2["step"]
            for k in s1["policy"]:
                torch.testing.assert_close(s1["policy"][k], s2["policy"][k], rtol=1e-4, atol=1e-6)
        else:  # sampled text, features, states, transitions, adapter: bit for bit
            assert p.read_bytes() == q.read_bytes(), rel
    samples = pd.concat(pd.read_parquet(p) for r, p in a.items() if "exploration/samples.parquet" in r)
    assert samples.text.nunique() > 1


def test_a_single_process_under_accelerate_says_how_to_launch_several(monkeypatch, caplog):
    import logging

    from ctrls.stages import distributed as D

    monkeypatch.setattr(D, "_WORLD", None)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    with caplog.at_level(logging.WARNING, logger="ctrls.stages.distributed"):
        assert D.world().size == 1
    assert "single process" in caplog.text and "torchrun --nproc_per_node" in caplog.text
    monkeypatch.setattr(D, "_WORLD", None)
