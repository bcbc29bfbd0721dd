"""REINFORCE (Eq. 14) on a synthetic MDP whose reward depends only on the state sequence."""
import numpy as np
import pandas as pd
import pytest
import torch

from ctrls.config import load_config
from ctrls.policy import TransitionPolicy
from ctrls.rl import Setting, Trainer, Trajectory, parse_setting, reinforce_loss
from ctrls.sampling import stream_key

K, T, GOAL = 4, 3, 2


def mdp_sampler(policy):
    """s_0 = state 0; a_t ~ pi~(. | s_{t-1}) for T steps; reward 1 if the last state is GOAL.
    Trajectory m of question slot j is seeded by (seeds[j], m) alone, like the real sampler."""
    def sample(qs, sample_ids, eps, seeds):
        out = []
        for gi, (ms, seed) in enumerate(zip(sample_ids, seeds)):
            for m in ms:
                s = [torch.nn.functional.one_hot(torch.tensor(0), K).float()]
                g = torch.Generator().manual_seed(stream_key(seed, m) & (2**64 - 1))
                for _ in range(T):
                    s.append(policy.sample(s[-1], eps, generator=g))
                traj = torch.stack(s)
                out.append(Trajectory(states=traj, reward=float(traj[-1].argmax() == GOAL), group=gi))
        return out
    return sample


def draw(policy, n, eps=0.0, seed=123):
    return mdp_sampler(policy)([0], [range(n)], eps, [seed])


def expected_reward(policy, n=4000, seed=123):
    """Monte Carlo estimate with one generator for the whole batch (fast; evaluation only)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.nn.functional.one_hot(torch.zeros(n, dtype=torch.long), K).float()
    for _ in range(T):
        s = policy.sample(s, 0.0, generator=g)
    return float((s.argmax(-1) == GOAL).float().mean())


def cfg_for(alpha=0.0, eps=0.0, steps=60, **rl):
    return load_config("smoke", [f"rl.steps={steps}", "rl.lr=0.1", "rl.group_size=32", "rl.checkpoint_every=1000",
                                 f"rl.entropy_coef={alpha}", f"rl.epsilon={eps}", *[f"rl.{k}={v}" for k, v in rl.items()]])


def train(tmp_path, name, alpha=0.0, eps=0.0, seed=0, steps=60, **rl):
    cfg = cfg_for(alpha, eps, steps, **rl)
    policy = TransitionPolicy(K, concentration=5.0)
    tr = Trainer(policy, cfg, Setting(name, eps, alpha), seed, tmp_path / f"{name}{seed}", mdp_sampler(policy), 1)
    tr.run(steps, progress=False)
    return policy, pd.DataFrame(tr.log)


@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_raises_the_expected_reward(tmp_path, seed):
    before = expected_reward(TransitionPolicy(K, concentration=5.0))
    policy, _ = train(tmp_path, "none", seed=seed)
    after = expected_reward(policy)
    assert before < 0.35 and after > before + 0.25


def test_group_mean_baseline_also_learns(tmp_path):
    policy, _ = train(tmp_path, "base", baseline="group_mean")
    assert expected_reward(policy) > 0.5


def test_entropy_bonus_keeps_the_policy_entropy_higher(tmp_path):
    s = torch.eye(K)
    ent = {}
    for alpha in (0.0, 0.1):
        pols = [train(tmp_path / f"a{alpha}", "x", alpha=alpha, seed=seed, steps=60)[0] for seed in (0, 1)]
        with torch.no_grad():
            ent[alpha] = float(torch.stack([p.entropy(s).mean() for p in pols]).mean())
    assert ent[0.1] > ent[0.0] + 0.15


def test_gradients_reach_only_L_and_c():
    policy = TransitionPolicy(K)
    extra = torch.nn.Parameter(torch.ones(3))  # anything else (adapter, backbone) gets no gradient
    trajs = draw(policy, 8, 0.1, seed=0)
    loss, info = reinforce_loss(policy, trajs, 0.1, 0.01)
    loss.backward()
    assert policy.L.grad is not None and policy.L.grad.abs().sum() > 0 and policy.log_c.grad is not None
    assert extra.grad is None and {n for n, _ in policy.named_parameters()} == {"L", "log_c"}
    assert 0 <= info["reward"] <= 1


def test_resume_continues_the_curve_exactly(tmp_path):
    cfg = cfg_for(steps=6, checkpoint_every=2)
    full_pol = TransitionPolicy(K, concentration=5.0)
    full = Trainer(full_pol, cfg, Setting("x", 0.1, 0.01), 0, tmp_path / "full", mdp_sampler(full_pol), 1)
    full.run(6, progress=False)

    pol = TransitionPolicy(K, concentration=5.0)
    sampler = mdp_sampler(pol)
    calls = {"n": 0}

    def crashing(*a):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # killed during step 4; the last checkpoint is at step 2
        return sampler(*a)

    with pytest.raises(KeyboardInterrupt):
        Trainer(pol, cfg, Setting("x", 0.1, 0.01), 0, tmp_path / "cut", crashing, 1).run(6, progress=False)
    pol2 = TransitionPolicy(K, concentration=5.0)
    resumed = Trainer(pol2, cfg, Setting("x", 0.1, 0.01), 0, tmp_path / "cut", mdp_sampler(pol2), 1)
    assert resumed.step == 2
    resumed.run(6, progress=False)
    a, b = pd.DataFrame(full.log), pd.DataFrame(resumed.log)
    assert list(b.step) == [1, 2, 3, 4, 5, 6]
    pd.testing.assert_frame_equal(a, b)
    assert torch.equal(full_pol.L, pol2.L)


def test_settings():
    cfg = load_config("smoke", ["rl.epsilon=0.2", "rl.entropy_coef=0.05"])
    assert parse_setting("both", cfg) == Setting("both", 0.2, 0.05)
    assert parse_setting("eps=0.3", cfg) == Setting("eps=0.3", 0.3, 0.0)
    assert parse_setting("H=0.01", cfg) == Setting("H=0.01", 0.0, 0.01)
    with pytest.raises(ValueError, match="unknown RL setting"):
        parse_setting("greedy", cfg)
