"""REINFORCE (Eq. 16) on a synthetic MDP whose reward depends only on the state sequence."""
import math

import pandas as pd
import pytest
import torch

from ctrls.config.schema import load_config
from ctrls.config.settings import Setting, parse_setting
from ctrls.method.policy import TransitionPolicy
from ctrls.method.reinforce import Trajectory, reinforce_loss
from ctrls.method.streams import stream_key
from ctrls.stages.trainer import Trainer

K, T, GOAL = 4, 3, 2


def mdp_sampler(policy):
    """s_0 = state 0; a_t ~ pi~(. | s_{t-1}) for T steps; reward 1 if the last state is GOAL.
    Trajectory m of question slot j is seeded by (seeds[j], m) alone, like the real sampler."""
    def sample(qs, sample_ids, eps, seeds):
        out = []
        for gi, (ms, seed) in enumerate(zip(sample_ids, seeds)):
            for m in ms:
                s = [torch.nn.functional.one_hot(torch.tensor(0), K).float()]
                logs = []
                g = torch.Generator().manual_seed(stream_key(seed, m) & (2**64 - 1))
                for _ in range(T):
                    logs.append(policy.sample_log(s[-1], eps, generator=g))
                    s.append(logs[-1].exp().float())
                traj = torch.stack(s)
                out.append(Trajectory(states=traj, reward=float(traj[-1].argmax() == GOAL), group=gi,
                                      log_actions=torch.stack(logs)))
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
    keys = {"steps": steps, "lr": 0.1, "group_size": 32, "checkpoint_every": 1000, "entropy_coef": alpha, "epsilon": eps,
            **rl}  # a key given in rl replaces the default (the config refuses a key given twice)
    return load_config("smoke", [f"rl.{k}={v}" for k, v in keys.items()])


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


@pytest.mark.parametrize("G", [2, 4])
def test_group_baseline_keeps_the_expected_gradient(one_thread, G):
    """The leave-one-out group baseline is unbiased: over many groups its gradient equals the
    no-baseline gradient of the same trajectories (their difference has mean 0). A group mean that
    includes the trajectory's own return would give (G - 1) / G of it (0.5 at G = 2)."""
    torch.manual_seed(0)
    pol = TransitionPolicy(K, concentration=5.0)
    with torch.no_grad():
        pol.L.copy_(torch.randn(K, K))
    n_groups = 20000 // G
    s0 = torch.nn.functional.one_hot(torch.zeros(n_groups * G, dtype=torch.long), K).float()
    log_a = pol.sample_log(s0, 0.0, generator=torch.Generator().manual_seed(1))
    reward = (log_a.argmax(-1) == GOAL).float()
    trajs = [Trajectory(torch.stack([s0[i], log_a[i].exp().float()]), float(reward[i]), i // G,
                        log_actions=log_a[i:i + 1]) for i in range(len(s0))]

    def grad(baseline):
        pol.zero_grad()
        reinforce_loss(pol, trajs, 0.0, 0.0, baseline=baseline)[0].backward()
        return torch.cat([pol.L.grad.flatten(), pol.log_c.grad.flatten()]).clone()

    g_none, g_loo = grad("none"), grad("group_mean")
    ratio = float(g_loo @ g_none / (g_none @ g_none))
    assert 0 < reward.mean() < 1 and float(g_none.norm()) > 0.05
    assert ratio == pytest.approx(1.0, abs=0.1), ratio  # the biased group mean gives (G - 1) / G
    # a group of one gets no baseline: its advantage is its return
    single = [Trajectory(trajs[0].states, 1.0, 0, log_actions=trajs[0].log_actions)]
    pol.zero_grad()
    reinforce_loss(pol, single, 0.0, 0.0, baseline="group_mean")[0].backward()
    g1 = pol.L.grad.clone()
    pol.zero_grad()
    reinforce_loss(pol, single, 0.0, 0.0, baseline="none")[0].backward()
    torch.testing.assert_close(g1, pol.L.grad)


def test_entropy_bonus_keeps_the_policy_entropy_higher(tmp_path):
    s = torch.eye(K)
    ent = {}
    for alpha in (0.0, 0.1):
        pols = [train(tmp_path / f"a{alpha}", "x", alpha=alpha, seed=seed, steps=60)[0] for seed in (0, 1)]
        with torch.no_grad():
            ent[alpha] = float(torch.stack([p.entropy(s).mean() for p in pols]).mean())
    assert ent[0.1] > ent[0.0] + 0.15


@pytest.mark.parametrize("eps,alpha,entropy_grad", [(0.1, 0.01, "full"), (0.0, 0.5, "eq16"), (0.3, 0.0, "full")])
def test_loss_gradient_equals_a_per_trajectory_reference(eps, alpha, entropy_grad):
    """reinforce_loss's gradient against Eq. 16 written out per trajectory with torch.distributions:
    -(1/N) sum_i [(R_i + alpha sum_t H_t) sum_t grad log pi~(a_t | s_t)] (- alpha/N sum_i sum_t grad H_t, 'full')."""
    policy = TransitionPolicy(K, concentration=5.0)
    with torch.no_grad():
        policy.L.normal_(0, 0.5)
    trajs = draw(policy, 12, eps, seed=4)
    loss, _ = reinforce_loss(policy, trajs, eps, alpha, entropy_grad=entropy_grad)
    got = torch.autograd.grad(loss, [policy.L, policy.log_c])
    ref = 0.0
    for tr in trajs:
        logp, H = 0.0, 0.0
        for t in range(len(tr.states) - 1):
            p = tr.states[t] @ torch.softmax(policy.L, -1)
            dir_lp = torch.distributions.Dirichlet(policy.log_c.exp() * p).log_prob(tr.states[t + 1])
            logp = logp + torch.log((1 - eps) * dir_lp.exp() + eps * math.factorial(K - 1))
            H = H + -(p * p.log()).sum()
        ref = ref - (tr.reward + alpha * H.detach()) * logp / len(trajs)
        if entropy_grad == "full":
            ref = ref - alpha * H / len(trajs)
    want = torch.autograd.grad(ref, [policy.L, policy.log_c])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert {n for n, _ in policy.named_parameters()} == {"L", "log_c"}


def sharp_chain_policy(c=20.0):
    pol = TransitionPolicy(K, concentration=c)
    off = 0.02 / (K - 1)
    with torch.no_grad():
        pol.L.copy_(torch.full((K, K), math.log(off)) + torch.eye(K) * (math.log(0.98) - math.log(off)))
    return pol


@pytest.mark.parametrize("reward", ["constant", "coin flip"])
@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_an_uninformative_reward_has_zero_expected_gradient(one_thread, reward, eps):
    """A reward that carries no information about the actions (always 1, or a fair coin flipped
    independently of them) has E[grad J] = 0, so it must not move L or c in expectation. The old
    clamped estimator gave dJ/dlog c = 32.5 for the constant reward."""
    policy = sharp_chain_policy()
    coin = torch.Generator().manual_seed(7)
    batches = []
    for b in range(32):
        trajs = draw(policy, 48, eps, seed=1000 + b)
        for tr in trajs:
            tr.reward = 1.0 if reward == "constant" else float(torch.rand((), generator=coin) < 0.5)
        loss, _ = reinforce_loss(policy, trajs, eps, 0.0)
        grads = torch.autograd.grad(loss, [policy.L, policy.log_c])
        batches.append(torch.cat([grads[0].flatten(), grads[1].view(1)]).double())
    G = torch.stack(batches)
    mean, se = G.mean(0), G.std(0) / math.sqrt(len(G))
    z = mean[se > 0] / se[se > 0]
    assert z.abs().max() < 5.0, f"max |z| {float(z.abs().max()):.1f}, dJ/dlog c {float(mean[-1]):.3f} +- {float(se[-1]):.3f}"


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


def test_labels_merge_with_the_papers_tables_for_the_judge_pair():
    from ctrls.config.settings import judge_pair, setting_label
    from ctrls.report.paper import PAPER_TABLE3, paper_table2
    from ctrls.stages.judge import table3_labels
    from ctrls.stages.rl import rl_runs, table_rows

    assert setting_label(0.0, 0.0) == "ε=0.0, H=0.0" and setting_label(0.1, 0.01) == "ε=0.1, H=0.01"
    cfg = load_config("paper")
    b, d = judge_pair(cfg)
    assert (b, d) == ("Qwen/Qwen2.5-3B-Instruct", "gsm8k")
    # Table 3: exactly the paper's six rows, every one of them trained
    assert table3_labels(cfg) == list(PAPER_TABLE3.setting)
    rows = {s.label for s in table_rows(cfg, b, d)}
    assert set(table3_labels(cfg)[1:]) <= rows
    runs = rl_runs(cfg, b, d)
    assert all((s.epsilon, s.alpha, cfg.rl.seeds[0]) in runs for s in table_rows(cfg, b, d))
    assert len(runs) == len(set(runs))  # each (epsilon, alpha, seed) once
    # other pairs train Table 2 and the curves, not Table 3's extra rows
    other = {s.label for s in table_rows(cfg, "meta-llama/Llama-3.2-3B-Instruct", "math")}
    assert "ε=0.3, H=0.01" not in other
    # Table 2: every paper row of every pair has one of ours with the same label
    ours = {"Base"} | {parse_setting(s, cfg).label for s in cfg.rl.table2}
    paper = paper_table2()
    assert set(paper.config) <= ours, set(paper.config) - ours
    merged = paper.merge(pd.DataFrame({"config": sorted(ours)}), on="config", how="left", indicator=True)
    assert (merged._merge == "both").all()


def test_the_paper_profile_sizes():
    cfg = load_config("paper")
    assert cfg.data.n_test == 40  # Table 1
    assert cfg.rl.n_test == 500  # Table 2
    assert cfg.rl.eval_questions <= cfg.rl.n_test  # the curves evaluate on Table 2's first questions
    assert cfg.judge.samples_per_config == 100


def test_wilson_interval_matches_the_closed_form_reference():
    from ctrls.report.tables import wilson

    lo, hi = wilson(0, 20)  # k = 0: [0, z^2 / (n + z^2)]
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(1.959964**2 / (20 + 1.959964**2), rel=1e-6)
    lo, hi = wilson(5, 10)  # symmetric around 1/2; reference value 0.2366 .. 0.7634
    assert lo == pytest.approx(0.23659, abs=1e-4) and hi == pytest.approx(0.76341, abs=1e-4)


def test_reward_rate_counts_trajectories_from_the_logs():
    from ctrls.report.tables import reward_rate

    cfg = load_config("smoke", ["rl.questions_per_step=2", "rl.group_size=4"])
    curves = pd.DataFrame({"pair": "p", "setting": ["a", "a", "b", "b", "a"], "seed": 0,
                           "kind": ["train", "train", "train", "train", "eval"], "reward": [0.0, 0.25, 0.5, 0.0, 1.0]})
    r = reward_rate(cfg, curves).iloc[0]
    assert (r.trajectories, r.correct, r.runs) == (32, 6, 2) and r["reward rate"] == 6 / 32


def _has_tensorboard():
    import importlib.util
    return importlib.util.find_spec("tensorboard") is not None


@pytest.mark.skipif(not _has_tensorboard(), reason="the tensorboard package is not installed")
def test_tensorboard_event_file_is_written_when_on(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = cfg_for(steps=2, eval_every=1)
    policy = TransitionPolicy(K, concentration=5.0)
    tr = Trainer(policy, cfg, Setting("x", 0.1, 0.01), 0, tmp_path / "run", mdp_sampler(policy), 1,
                 evaluate=lambda p, step: {"accuracy": 0.5}, tensorboard=tmp_path / "tb")
    tr.run(2, progress=False)
    acc = EventAccumulator(str(tmp_path / "tb")).Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/reward", "train/policy_entropy", "train/concentration", "eval/accuracy"} <= set(tags)
    assert [e.step for e in acc.Scalars("train/reward")] == [1, 2]
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [0, 1, 2]


@pytest.mark.skipif(_has_tensorboard(), reason="tensorboard is installed")
def test_tensorboard_without_the_package_is_a_clear_error(tmp_path):
    policy = TransitionPolicy(K, concentration=5.0)
    with pytest.raises(ImportError, match="rl.tensorboard"):
        Trainer(policy, cfg_for(steps=1), Setting("x", 0.0, 0.0), 0, tmp_path / "run", mdp_sampler(policy), 1,
                tensorboard=tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


# ---- finite or refused -----------------------------------------------------------


def _trainer(tmp_path, alpha=0.0, eps=0.0):
    policy = TransitionPolicy(K, concentration=5.0)
    return Trainer(policy, cfg_for(steps=2), Setting("x", eps, alpha), 0, tmp_path / "run", mdp_sampler(policy), 1)


def _params(policy):
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def test_a_non_finite_loss_is_refused_before_the_step(tmp_path):
    """rl.entropy_coef=1e308 (past the config's range) gave loss -inf, a NaN gradient, and NaN in checkpoint.pt."""
    from ctrls.method.policy import NonFiniteError

    tr = _trainer(tmp_path, alpha=1e308)
    before = _params(tr.policy)
    with pytest.raises(NonFiniteError, match="RL loss at step 1"):
        tr.run(2, progress=False)
    assert all(torch.equal(before[k], v) for k, v in tr.policy.state_dict().items()) and tr.step == 0
    assert not tr.ckpt.exists()


def test_a_non_finite_gradient_is_refused_before_the_step(tmp_path, monkeypatch):
    import ctrls.stages.trainer
    from ctrls.method.policy import NonFiniteError

    tr = _trainer(tmp_path)
    before = _params(tr.policy)

    def nan_gradient(policy, *args, **kwargs):  # a finite loss (0) whose gradient is 0 * inf = NaN
        return torch.sqrt(policy.L[0, 0] - policy.L[0, 0].detach()), {}

    monkeypatch.setattr(ctrls.stages.trainer, "reinforce_loss", nan_gradient)  # where the trainer looks it up
    with pytest.raises(NonFiniteError, match="gradient of policy.L at step 1"):
        tr.train_step()
    assert all(torch.equal(before[k], v) for k, v in tr.policy.state_dict().items()) and tr.step == 0


def test_a_non_finite_policy_is_never_saved_nor_resumed(tmp_path, caplog):
    from ctrls.method.policy import NonFiniteError

    tr = _trainer(tmp_path)
    tr.run(1, progress=False)
    good = tr.ckpt.read_bytes()
    with torch.no_grad():
        tr.policy.L[1, 2] = float("nan")
    with pytest.raises(NonFiniteError, match="not saved"):
        tr.save()
    assert tr.ckpt.read_bytes() == good
    state = torch.load(tr.ckpt, weights_only=False)  # a NaN checkpoint written by an older version
    state["policy"]["log_c"] = torch.tensor(float("inf"))
    torch.save(state, tr.ckpt)
    again = _trainer(tmp_path)
    assert again.step == 0 and torch.isfinite(again.policy.log_c)
    assert "unusable" in caplog.text


@pytest.mark.parametrize("reward", [float("nan"), float("inf")])
def test_reinforce_loss_refuses_a_non_finite_reward(reward):
    from ctrls.method.policy import NonFiniteError

    policy = TransitionPolicy(K, concentration=5.0)
    trajs = draw(policy, 3)
    trajs[1].reward = reward
    with pytest.raises(NonFiniteError, match="trajectory 1 has reward"):
        reinforce_loss(policy, trajs, 0.0, 0.0)


def test_a_masked_trajectory_enters_eq16_with_the_density_of_its_allowed_states():
    """A trajectory drawn under a position mask: its loss is minus the return times the masked draws'
    log-density (TransitionPolicy.log_prob_log with ``allowed``); without its ``allowed`` it is refused."""
    from ctrls.method.positions import PositionMask

    torch.manual_seed(0)
    pol = TransitionPolicy(4, concentration=5.0)
    with torch.no_grad():
        pol.L.normal_()
    pm = PositionMask(torch.tensor([[True, True, False, True], [False, True, True, True]]), torch.ones(2, 4, dtype=torch.long))
    g, prev, logs = torch.Generator().manual_seed(1), torch.full((1, 4), 0.25), []
    for t in range(2):
        logs.append(pm.mask_log(pol.sample_log(prev, 0.1, generator=g), t)[0])
        prev = logs[-1].exp()[None]
    log_a = torch.stack(logs).detach()
    states = torch.cat([torch.full((1, 4), 0.25), log_a.exp()])
    allowed = pm.allowed.clone()
    loss, _ = reinforce_loss(pol, [Trajectory(states, 1.0, 0, log_actions=log_a, allowed=allowed)], 0.1, 0.0)
    want = -pol.log_prob_log(log_a, states[:-1], 0.1, allowed=allowed).sum()
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    with pytest.raises(ValueError):
        reinforce_loss(pol, [Trajectory(states, 1.0, 0, log_actions=log_a)], 0.1, 0.0)
