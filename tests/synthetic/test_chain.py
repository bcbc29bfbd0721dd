"""The synthetic latent-chain study (ctrls.synthetic.chain): exact optimum, REINFORCE on the MDP, L recovery."""
import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch

from ctrls.config.schema import load_config
from ctrls.config.settings import Setting
from ctrls.method.policy import TransitionPolicy
from ctrls.stages import synthetic as stage
from ctrls.stages.trainer import Trainer
from ctrls.synthetic import chain as sy


@pytest.fixture(autouse=True)
def one_thread():
    """K x K tensors: torch's threads only add overhead (and contend on a shared machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_chain(K=3):
    """start 0 -> 1 -> 2, reward 1 at state 2: the only rewarding chain."""
    E = np.zeros((K, K), dtype=bool)
    E[0, 1] = E[1, 2] = True
    r = np.zeros(K)
    r[2] = 1
    return sy.ChainMDP(E, r, 0, 2)


def test_optimum_of_a_single_chain_by_hand():
    mdp = tiny_chain()
    assert sy.optimum(mdp, 0.0) == 1.0
    # each of the 2 steps is right with probability (1 - eps) + eps / K = 0.7 + 0.1 = 0.8
    assert sy.optimum(mdp, 0.3) == pytest.approx(0.8 ** 2)
    V, greedy = sy.optimal_values(mdp, 0.0)
    assert greedy[0, 0] == 1 and greedy[1, 1] == 2


def test_optimum_of_the_study_chain_by_hand():
    """K = 8, T = 3, easy reward 0.5, eps = 0.1, backward induction written out:
    V2(c2) = 0.9 * 1 + 0.1 * (1 + 0.5) / 8 = 0.91875          (c2 -> c3 or, falling off, e3)
    V2(e2) = 0.9 * 0.5 + 0.1 * 0.5 / 8 = 0.45625
    V1(c1) = 0.9 * 0.91875 + 0.1 * (0.91875 + 0.45625) / 8 = 0.8440625
    V1(e1) = 0.9 * 0.45625 + 0.1 * 0.45625 / 8 = 0.416328125
    V0(S)  = 0.9 * 0.8440625 + 0.1 * (0.8440625 + 0.416328125) / 8 = 0.775411...
    """
    mdp = sy.reasoning_chain(8, 3, 0.5)
    assert sy.optimum(mdp, 0.0) == 1.0
    V, _ = sy.optimal_values(mdp, 0.1)
    assert V[2, mdp.correct[1]] == pytest.approx(0.91875)
    assert V[1, mdp.easy[0]] == pytest.approx(0.416328125)
    assert sy.optimum(mdp, 0.1) == pytest.approx(0.9 * 0.8440625 + 0.1 * (0.8440625 + 0.416328125) / 8)
    # the chain alone would give less: random moves onto the easy path still pay
    assert sy.optimum(mdp, 0.1) > (1 - 0.1 + 0.1 / 8) ** 3


def _exact_policy_value(mdp, pi, eps, rewards):
    """Expected reward of the deterministic Markov policy pi[t][z] under eps-uniform moves, by
    enumerating every latent chain with its probability (independent of backward induction)."""
    K = mdp.n_states
    total = 0.0
    for z, r in rewards.items():
        prob, prev = 1.0, mdp.start
        for t, zt in enumerate(z):
            prob *= (1 - eps) * (pi[t][prev] == zt) + eps / K
            prev = zt
        total += prob * r
    return total


@pytest.mark.parametrize("eps", [0.0, 0.25])
def test_backward_induction_equals_the_best_of_all_deterministic_policies(eps):
    mdp = sy.reasoning_chain(5, 2, 0.4)  # S, c1, c2, e1, e2
    K = mdp.n_states
    chains = list(itertools.product(range(K), repeat=mdp.horizon))
    rewards = dict(zip(chains, sy.chain_rewards(mdp, torch.tensor(chains)).tolist()))
    # step 1 only ever leaves the start state, so a policy is its first choice and a full second row
    best = max(_exact_policy_value(mdp, [[a0] * K, list(pi1)], eps, rewards)
               for a0 in range(K) for pi1 in itertools.product(range(K), repeat=K))
    assert sy.optimum(mdp, eps) == pytest.approx(best)
    _, greedy = sy.optimal_values(mdp, eps)
    assert _exact_policy_value(mdp, greedy, eps, rewards) == pytest.approx(best)


def test_chain_rewards_need_every_edge():
    mdp = sy.reasoning_chain(8, 3, 0.5)  # c = 1, 2, 3; e = 4, 5, 6
    z = torch.tensor([[1, 2, 3], [4, 5, 6], [1, 5, 6], [1, 2, 6], [4, 2, 3], [1, 7, 3], [2, 3, 3]])
    assert sy.chain_rewards(mdp, z).tolist() == [1.0, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0]


def test_a_chain_mdp_too_small_for_its_paths_names_the_key():
    with pytest.raises(ValueError, match="synthetic.n_states"):
        sy.reasoning_chain(6, 3, 0.5)
    with pytest.raises(ValueError, match="synthetic.easy_reward"):
        sy.reasoning_chain(8, 3, 1.0)


def test_the_prior_prefers_the_easy_path():
    mdp = sy.reasoning_chain(8, 3, 0.5)
    P = sy.behaviour_prior(mdp, p_rare=0.15, p_follow=0.95, noise=0.02)
    assert torch.allclose(P.sum(1), torch.ones(8)) and bool((P > 0).all())
    assert P[0, mdp.easy[0]] > 5 * P[0, mdp.correct[0]]
    assert P[mdp.correct[0], mdp.correct[1]] == pytest.approx(0.98 * 0.95 + 0.02 / 8)


# ---- REINFORCE on the MDP: the same TransitionPolicy, reinforce_loss and Trainer as the LLM path ----

RL_OVERRIDES = ["synthetic.n_states=5", "synthetic.horizon=2", "synthetic.easy_reward=0.0", "synthetic.p_rare=0.3",
                "synthetic.p_follow=0.9", "synthetic.concentration=5.0", "synthetic.steps=40",
                "synthetic.group_size=16", "synthetic.lr=0.1", "synthetic.eval_every=40", "synthetic.eval_samples=1000"]


def test_reinforce_on_the_mdp_moves_the_reward_toward_the_optimum(tmp_path):
    """40 steps of plain REINFORCE (no exploration) from a prior that rarely finds the rewarding chain.
    Flipping the sign of the loss in ctrls.method.reinforce.reinforce_loss makes the reward fall instead."""
    cfg = load_config("smoke", RL_OVERRIDES)
    mdp, P = sy.study_mdp(cfg)
    policy = TransitionPolicy(mdp.n_states, concentration=cfg.synthetic.concentration)
    with torch.no_grad():
        policy.L.copy_(P.log())
    torch.manual_seed(0)
    trainer = Trainer(policy, stage.trainer_config(cfg), Setting("none", 0.0, 0.0), 0, tmp_path / "run",
                      sy.make_sampler(policy, mdp), 1, sy.make_evaluator(mdp, cfg.synthetic.eval_samples, 0))
    log = trainer.run(cfg.synthetic.steps, progress=False)
    ev = log[log.kind == "eval"].set_index("step")
    before, after = ev.eval_reward.loc[0], ev.eval_reward.loc[cfg.synthetic.steps]
    assert sy.optimum(mdp, 0.0) == 1.0
    assert before < 0.3 and after > before + 0.3  # measured: 0.09 -> 0.98 (flipped sign: 0.09 -> 0.00)
    assert ev.correct_chain.loc[cfg.synthetic.steps] == pytest.approx(after)  # easy path pays 0 here


# ---- recovering L with fit_transitions --------------------------------------------------------------


def test_fit_transitions_recovers_a_known_matrix_within_a_shrinking_tolerance():
    """Rows of a random K = 5 transition matrix; chains of length 4 from uniform starts. The MLE's
    per-row TV error is about 0.5 * sum_j sqrt(2 p_j (1 - p_j) / (pi m)) for m visits of the row,
    i.e. O(n^-1/2) in the number of chains n; the tolerance below is twice that bound at m = 3n / K."""
    cfg = load_config("smoke")
    K, length = 5, 4
    g = torch.Generator().manual_seed(7)
    gam = -torch.log(torch.rand(K, K, generator=g)) - torch.log(torch.rand(K, K, generator=g))  # Gamma(2) draws
    P = gam / gam.sum(1, keepdim=True)
    errors = {}
    for n in (30, 300, 3000):
        chains = sy.sample_chains(P, n, length, torch.Generator().manual_seed(n))
        mean_tv, _ = sy.transition_error(sy.fit_from_chains(chains, K, cfg), P)
        m = (length - 1) * n / K
        bound = float((0.5 * torch.sqrt(2 * P * (1 - P) / (math.pi * m)).sum(1)).mean())
        assert mean_tv < 2 * bound, f"{n} chains: mean TV {mean_tv:.4f} above twice the MLE's {bound:.4f}"
        errors[n] = mean_tv
    assert errors[3000] < errors[300] < errors[30]
    assert errors[3000] < 0.04


def test_sample_chains_follow_the_matrix():
    P = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])  # a deterministic cycle
    z = sy.sample_chains(P, 50, 5, torch.Generator().manual_seed(0))
    assert bool(((z[:, 1:] - z[:, :-1]) % 3 == 1).all())
    assert set(z[:, 0].tolist()) == {0, 1, 2}  # uniform starts visit every row


# ---- the whole study on the smoke profile -------------------------------------------------------------


def test_the_study_runs_its_runs_once_and_reports_every_claim(tmp_path):
    cfg = load_config("smoke", [f"run_dir={tmp_path}"])
    out = stage.run_study(cfg, progress=False)
    curves, recovery = stage.load_curves(cfg), stage.load_recovery(cfg)
    # 4 settings U (eps x alpha grid) with shared cells reused: (0,0) (0.1,0) (0,0.01) (0.1,0.01) x 2 seeds
    assert len(stage.study_runs(cfg)) == 8 and curves.groupby(["epsilon", "alpha", "seed"]).ngroups == 8
    assert (curves[curves.kind == "train"].groupby(["epsilon", "alpha", "seed"]).size() == cfg.synthetic.steps).all()
    assert set(recovery.chains) == set(cfg.synthetic.recovery_chains)
    summary = sy.run_summary(curves)
    assert list(sy.settings_table(summary, cfg).setting) == list(sy.SETTINGS)
    claims = sy.claims(summary, recovery, cfg)
    assert all(v in ("supported", "contradicted") or v.startswith("not supported: the estimate is ")
               for v in claims.verdict) and len(claims) >= 4
    stamp = (out / "curves.parquet").stat().st_mtime_ns
    stage.run_study(cfg, progress=False)  # cached: nothing is recomputed
    assert (out / "curves.parquet").stat().st_mtime_ns == stamp


def test_welch_interval_and_verdicts():
    from ctrls.synthetic import claims as sc

    d, lo, hi = sy.welch_interval([1.0, 2.0, 3.0])
    # mean 2, sd 1, n 3: half-width t_{0.975, 2} / sqrt(3) = 4.302653 / 1.732051
    assert d == 2 and hi - d == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert sc._verdict(0.1, 0.3, +1) == "supported" and sc._verdict(0.1, 0.3, -1) == "contradicted"
    assert sc._verdict(-0.1, 0.3, +1) == "not supported"


def test_welch_interval_is_never_a_point_and_respects_the_range():
    """Zero variance over seeds: no point interval. A bounded quantity: the interval stays in range
    (a t interval on 3 seeds went to [-1.019, -0.918] for a difference bounded by -1)."""
    d, lo, hi = sy.welch_interval([0.5, 0.5], [0.5, 0.5])
    assert d == 0.0 and lo < 0 < hi
    d, lo, hi = sy.welch_interval([0.5, 0.5], [0.5, 0.5], bounds=(0.0, 1.0))
    assert d == 0.0 and -1 <= lo < 0 < hi <= 1
    d, lo, hi = sy.welch_interval([0.0, 0.0, 0.02], [1.0, 0.98, 1.0], bounds=(0.0, 1.0))
    assert -1.0 <= lo < d < hi < 0 and d == pytest.approx(-0.9867, abs=1e-3)
    m, lo, hi = sy.welch_interval([1.0, 1.0, 1.0], bounds=(0.0, 1.0))
    assert m == 1.0 and hi == 1.0 and 0 < lo < 1
    # at least as wide as the t interval where the data vary, inside the range
    _, tlo, thi = sy.welch_interval([0.2, 0.5, 0.6])
    _, blo, bhi = sy.welch_interval([0.2, 0.5, 0.6], bounds=(0.0, 1.0))
    assert tlo < 0 and blo == 0.0 and bhi >= min(thi, 1.0) - 1e-4 and bhi <= 1  # the t interval left the range (grid 5e-5)
    with pytest.raises(ValueError, match="outside the stated range"):
        sy.welch_interval([1.5], bounds=(0.0, 1.0))


def test_claims_use_a_collapse_threshold_the_stated_rate_and_holm():
    """'Collapses without entropy' needs the runs without the bonus below the stated threshold AND below
    the entropy runs; 'L is learnable' tests the n^-1/2 rate (not slope < 0) and cites no paper claim;
    verdicts come from Holm-adjusted p-values."""
    from ctrls.config.schema import load_config
    from ctrls.stats.metrics import holm
    from ctrls.synthetic import claims as sc

    cfg = load_config("smoke", ["synthetic.seeds=[0, 1, 2, 3, 4, 5]"])
    rng = np.random.default_rng(0)
    rows = []
    for eps in cfg.synthetic.epsilons + [cfg.rl.epsilon]:
        for a in cfg.synthetic.alphas + [cfg.rl.entropy_coef]:
            for seed in cfg.synthetic.seeds:
                h_end = 0.6 + 0.05 * rng.random()  # no row collapses: every run keeps 0.6 nats
                if a == 0:
                    h_end = 0.4 + 0.05 * rng.random()  # less without the bonus, but far above the threshold
                rows.append({"setting": "x", "epsilon": eps, "alpha": a, "seed": seed, "reward_final": rng.random(),
                             "reward_mean": rng.random(), "easy_final": rng.random(), "correct_final": 0.0,
                             "start_entropy_first": 0.9, "start_entropy_final": h_end, "found": False, "on_easy": False})
    summary = pd.DataFrame(rows).drop_duplicates(["epsilon", "alpha", "seed"])
    n = np.array([10, 30, 100, 300, 1000, 3000])
    recovery = pd.DataFrame({"chains": np.repeat(n, 2), "mean_tv": np.repeat(0.05 * n ** -0.2, 2) * (1 + 0.01 * rng.random(12)),
                             "seed": [0, 1] * 6})
    c = sc.claims(summary, recovery, cfg).set_index("claim")
    collapse = c.loc["without entropy regularisation the policy collapses onto a few transitions"]
    assert "collapse: below" in collapse.measure and collapse.verdict.startswith("not supported")  # entropy fell, no collapse
    rate = c[c.index.str.contains("parametric rate")].iloc[0]
    assert rate.verdict == "contradicted"  # slope -0.2 < 0, but not the n^-0.5 rate
    assert "Thm. 5.3" not in rate.paper.split("(")[0] and "no recovery claim" in rate.paper
    assert np.allclose(c["p (Holm)"], holm(c.p))
    assert all(v in ("supported", "contradicted") or v.startswith("not supported: the estimate is ") for v in c.verdict)
    # the family interval (1 - 0.05/m, Bonferroni) on the Holm verdict's footing contains the 95% one
    bounds = lambda col: np.array([[float(x) for x in v.strip("[]").split(",")] for v in c[col]])  # noqa: E731
    per, fam = bounds("95% CI"), bounds("family CI")
    assert (fam[:, 0] <= per[:, 0] + 1e-9).all() and (fam[:, 1] >= per[:, 1] - 1e-9).all()
    assert ((fam[:, 1] - fam[:, 0]) > (per[:, 1] - per[:, 0]) + 1e-6).any()
    for v, (lo, hi) in zip(c.verdict, fam):  # a resolved difference never has a family interval across 0
        assert not (v in ("supported", "contradicted") and lo < 0 < hi)
