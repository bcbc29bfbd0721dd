"""Lockstep RL (ctrls.stages.trainer.run_lockstep): all runs of a pair in one shared batch equal the sequential runs."""
import copy

import pandas as pd
import pytest
import torch

from ctrls.config.schema import load_config
from ctrls.config.settings import Setting
from ctrls.generate.sampling import SampleParams, sample
from ctrls.method.policy import TransitionPolicy
from ctrls.method.reinforce import Trajectory
from ctrls.stages.trainer import Trainer, run_lockstep
from tests.generate.test_sampling import _prompts, random_ctrls
from tests.method.test_reinforce import K, mdp_sampler

SETTINGS = [Setting("none", 0.0, 0.0), Setting("epsilon", 0.3, 0.0), Setting("entropy", 0.0, 0.05),
            Setting("both", 0.3, 0.05)]


def cfg_for(steps, **rl):
    return load_config("smoke", [f"rl.steps={steps}", "rl.lr=0.1", "rl.group_size=4", "rl.questions_per_step=2",
                                 "rl.eval_every=2", *[f"rl.{k}={v}" for k, v in rl.items()]])


def mdp_eval(policy, step):
    """A deterministic function of the policy and step (what evaluate must be)."""
    trajs = mdp_sampler(policy)([0], [range(16)], 0.0, [1000 + step])
    return {"accuracy": sum(t.reward for t in trajs) / len(trajs), "c": float(policy.log_c.detach().exp())}


def mdp_trainers(cfg, root, seeds=(0,)):
    out = []
    for s in SETTINGS:
        for seed in seeds:
            pol = TransitionPolicy(K, concentration=5.0)
            out.append(Trainer(pol, cfg, s, seed, root / f"{s.name}{seed}", mdp_sampler(pol), 1, mdp_eval))
    return out


def batched_mdp(pairs):
    """One draw loop for all runs: each row with its own policy and epsilon (the lockstep sampler's
    contract), rows of different runs interleaved."""
    rows = [(k, gi, m, seed) for k, (t, p) in enumerate(pairs) for gi, (ms, seed) in enumerate(zip(p.sample_ids, p.seeds))
            for m in ms]
    out: list[list[Trajectory]] = [[] for _ in pairs]
    for k, gi, m, seed in sorted(rows, key=lambda r: (r[2], r[0])):  # an order unlike the sequential one
        t = pairs[k][0]
        out[k] += [tr.__class__(states=tr.states, reward=tr.reward, group=gi, log_actions=tr.log_actions)
                   for tr in mdp_sampler(t.policy)([0], [[m]], t.setting.epsilon, [seed])]
    return [_reorder(o, p) for o, (_, p) in zip(out, pairs)]


def _reorder(trajs, plan):
    by_group: dict[int, list] = {}
    for tr in trajs:
        by_group.setdefault(tr.group, []).append(tr)
    return [tr for gi in range(len(plan.sample_ids)) for tr in by_group.get(gi, [])]


def assert_runs_equal(a: list[Trainer], b: list[Trainer]):
    for x, y in zip(a, b):
        pd.testing.assert_frame_equal(pd.DataFrame(x.log), pd.DataFrame(y.log), obj=f"{x.setting.name} seed {x.seed}")
        for (k, v), (k2, v2) in zip(x.policy.state_dict().items(), y.policy.state_dict().items()):
            assert torch.equal(v, v2), (x.setting.name, x.seed, k)
        ca, cb = torch.load(x.ckpt, weights_only=False), torch.load(y.ckpt, weights_only=False)
        assert ca["step"] == cb["step"] and ca["log"] == cb["log"]
        for k in ca["policy"]:
            assert torch.equal(ca["policy"][k], cb["policy"][k])
        pd.testing.assert_frame_equal(pd.read_parquet(x.out / "curve.parquet"), pd.read_parquet(y.out / "curve.parquet"))


def test_lockstep_equals_sequential_on_the_mdp(tmp_path):
    cfg = cfg_for(6, checkpoint_every=2)
    seq = mdp_trainers(cfg, tmp_path / "seq")
    for t in seq:
        t.run(6, progress=False)
    lock = mdp_trainers(cfg, tmp_path / "lock")
    run_lockstep(lock, 6, sample_many=batched_mdp,
                 evaluate_many=lambda due: [mdp_eval(t.policy, step) for t, step in due], progress=False)
    assert_runs_equal(seq, lock)
    assert len({t.policy.log_c.item() for t in lock}) == len(lock)  # the runs really differ
    assert all(list(pd.DataFrame(t.log).query("kind == 'train'").step) == [1, 2, 3, 4, 5, 6] for t in lock)


def merged(calls):
    """sample_and_evaluate from the MDP's batched sampler and evaluation, recording each call's sizes."""
    def f(pairs, due):
        calls.append((len(pairs), [step for _, step in due]))
        return batched_mdp(pairs), [mdp_eval(t.policy, step) for t, step in due]
    return f


def test_evaluations_drawn_with_the_next_steps_samples_equal_sequential(tmp_path):
    cfg = cfg_for(6, checkpoint_every=2)
    seq = mdp_trainers(cfg, tmp_path / "seq")
    for t in seq:
        t.run(6, progress=False)
    calls, alone = [], []
    lock = mdp_trainers(cfg, tmp_path / "lock")
    run_lockstep(lock, 6, sample_many=batched_mdp, progress=False, sample_and_evaluate=merged(calls),
                 evaluate_many=lambda due: alone.append([s for _, s in due]) or [mdp_eval(t.policy, s) for t, s in due])
    assert_runs_equal(seq, lock)
    n = len(lock)
    assert calls == [(n, [0] * n), (n, [2] * n), (n, [4] * n)]  # eval_every=2: steps 0, 2, 4 ride on steps 1, 3, 5
    assert alone == [[6] * n]  # the last evaluation has no next step: alone


@pytest.mark.parametrize("ride", [False, True], ids=["evaluations apart", "evaluations riding"])
def test_lockstep_resume_after_a_kill_loses_and_duplicates_nothing(tmp_path, ride):
    cfg = cfg_for(6, checkpoint_every=2)
    full = mdp_trainers(cfg, tmp_path / "full")
    for t in full:
        t.run(6, progress=False)
    cut = mdp_trainers(cfg, tmp_path / "cut")
    real_save = cut[2].save

    def killed_saving():  # killed while saving step 4: runs 0-1 have their step-4 checkpoint, the rest step 2
        if cut[2].step == 4:
            raise KeyboardInterrupt
        real_save()

    cut[2].save = killed_saving
    with pytest.raises(KeyboardInterrupt):
        run_lockstep(cut, 6, sample_many=batched_mdp, progress=False, **({"sample_and_evaluate": merged([])} if ride else {}))
    resumed = mdp_trainers(cfg, tmp_path / "cut")
    assert [t.step for t in resumed] == [4, 4] + [2] * (len(resumed) - 2)
    calls = []
    if ride:  # each checkpoint was written before its step's evaluation (drawn with the next step's samples)
        assert all(list(pd.DataFrame(t.log).query("kind == 'eval'").step) == list(range(0, t.step, 2)) for t in resumed)
    run_lockstep(resumed, 6, sample_many=batched_mdp, progress=False, **({"sample_and_evaluate": merged(calls)} if ride else {}))
    if ride:
        assert calls[0] == (len(resumed), [4, 4] + [2] * (len(resumed) - 2))  # the missing evaluations, redrawn first
    assert_runs_equal(full, resumed)
    for t in resumed:
        train = pd.DataFrame(t.log).query("kind == 'train'")
        assert list(train.step) == [1, 2, 3, 4, 5, 6]


# ---- the real decode batch, on a tiny random-weight model -----------------------------------------


def test_per_row_policies_in_one_batch_equal_separate_runs(tiny_qwen2):
    """sample(..., policies=, epsilons=) draws each prompt's states with its own policy and epsilon,
    exactly as a separate call with that policy as model.policy."""
    tok = tiny_qwen2.tokenizer
    prompts = _prompts(tok)
    model = random_ctrls(tiny_qwen2, trained=True, scale=0.5)
    pols = [copy.deepcopy(model.policy) for _ in range(3)]
    with torch.no_grad():
        for i, p in enumerate(pols):
            p.L.add_(torch.randn(p.L.shape, generator=torch.Generator().manual_seed(i)) * 3)
            p.log_c.add_(i - 1.0)
    eps = [0.0, 0.3, 0.6]
    params = SampleParams(temperature=1.0, max_new_tokens=16, max_steps=100, batch_size=64)
    jobs = [(r, i) for r in range(3) for i in range(len(prompts))]
    together = sample(tiny_qwen2, [prompts[i] for _, i in jobs], 3, params, model=model,
                      seeds=[100 + i for _, i in jobs], policies=[pols[r] for r, _ in jobs], epsilons=[eps[r] for r, _ in jobs])
    for r in range(3):
        alone_model = copy.deepcopy(model)
        alone_model.policy = pols[r]
        alone = sample(tiny_qwen2, prompts, 3, SampleParams(**{**params.__dict__, "epsilon": eps[r]}), model=alone_model,
                       seeds=[100 + i for i in range(len(prompts))])
        for i, gs in enumerate(alone):
            for x, y in zip(gs, together[r * len(prompts) + i]):
                assert x.token_ids == y.token_ids
                assert torch.equal(x.states, y.states) and torch.equal(x.log_actions, y.log_actions)
    # the policies matter: the same seeds under different policies draw different states
    assert not torch.equal(together[0][0].states[1:], together[len(prompts)][0].states[1:])
