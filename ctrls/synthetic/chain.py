"""A controlled study of Alg. 2 (Eq. 14 and Eq. 16) on a synthetic latent chain whose optimum is known exactly.

The same ``TransitionPolicy``, ``reinforce_loss`` and ``Trainer`` as the LLM path run on a small MDP:
start 0, a correct chain 1..T (reward 1), an easy path T+1..2T (``easy_reward`` < 1, what the prior
prefers), distractors beyond. The action is a ~ pi~(. | s) with s_t = a_t, and the reward sees
z_t = argmax a_t. :func:`optimal_values` gives the exact optimum at each eps by backward induction, an
upper bound on any eps-greedy Dirichlet policy. The stage (``ctrls.stages.synthetic.run_study``) records
learning curves and an L-recovery experiment; the verdicts on the paper's claims are in
``ctrls.synthetic.claims`` (``claims``, ``claims_text``, ``recovery_slope``, ``welch_interval`` are
re-exported here). The MDP, its prior and the optimum: book/method.md, "ctrls/synthetic/chain.py".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ctrls.config.schema import Config
from ctrls.method.policy import TransitionPolicy, fit_transitions
from ctrls.method.reinforce import Sampler, Trajectory, state_usage_entropy
from ctrls.method.streams import stream_key

_CLAIMS = ("claims", "claims_text", "recovery_slope", "welch_interval")  # the page's API, from ctrls.synthetic.claims


def __getattr__(name: str):
    """``claims``, ``claims_text``, ``recovery_slope`` and ``welch_interval`` of ``ctrls.synthetic.claims``,
    imported on first use: the study's worker processes need none of them (nor scipy)."""
    if name in _CLAIMS:
        from ctrls.synthetic import claims as c

        return getattr(c, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_MASK = 2**63 - 1
SETTINGS = ("none", "epsilon", "entropy", "both")  # the paper's four RL curves (App. C.1, Figs. 4-5)


@dataclass(frozen=True)
class ChainMDP:
    """A finite-horizon latent MDP: a chain z_1..z_T from ``start`` earns ``terminal_reward[z_T]``
    if every transition is an edge (``edges[z, z']``), else 0."""

    edges: np.ndarray  # (K, K) bool: the rewarding transitions
    terminal_reward: np.ndarray  # (K,) reward of the last state
    start: int
    horizon: int
    correct: tuple[int, ...] = ()  # the correct chain c_1..c_T (for reporting)
    easy: tuple[int, ...] = ()  # the easy path e_1..e_T (for reporting)

    def __post_init__(self):
        K = len(self.terminal_reward)
        if self.edges.shape != (K, K):
            raise ValueError(f"edges must be ({K}, {K}) for {K} states, got {self.edges.shape}")
        if not 0 <= self.start < K or self.horizon < 1:
            raise ValueError(f"need 0 <= start < K and horizon >= 1, got start={self.start}, horizon={self.horizon}")

    @property
    def n_states(self) -> int:
        return len(self.terminal_reward)


def reasoning_chain(n_states: int, horizon: int, easy_reward: float) -> ChainMDP:
    """The study's MDP (book/method.md): start 0, correct chain 1..T, easy path T+1..2T, distractors."""
    K, T = n_states, horizon
    if T < 1 or K < 2 * T + 1:
        raise ValueError(f"synthetic.n_states must be >= 2 * synthetic.horizon + 1 = {2 * T + 1} "
                         f"(start, correct chain, easy path), got n_states={K}, horizon={T}")
    if not 0 <= easy_reward < 1:
        raise ValueError(f"synthetic.easy_reward must be in [0, 1) (the correct answer earns 1), got {easy_reward}")
    correct, easy = tuple(range(1, T + 1)), tuple(range(T + 1, 2 * T + 1))
    E = np.zeros((K, K), dtype=bool)
    for path in (correct, easy):
        E[0, path[0]] = True
        for a, b in zip(path[:-1], path[1:]):
            E[a, b] = True
    for i in range(T - 1):
        E[correct[i], easy[i + 1]] = True  # falling off the chain onto the easy path
    r = np.zeros(K)
    r[correct[-1]], r[easy[-1]] = 1.0, easy_reward
    return ChainMDP(E, r, 0, T, correct, easy)


def state_names(mdp: ChainMDP) -> list[str]:
    """S, c1..cT, e1..eT, d1.. (start, correct chain, easy path, distractors)."""
    names = [f"d{i}" for i in range(mdp.n_states)]
    names[mdp.start] = "S"
    for i, j in enumerate(mdp.correct):
        names[j] = f"c{i + 1}"
    for i, j in enumerate(mdp.easy):
        names[j] = f"e{i + 1}"
    k = 0
    for j, n in enumerate(names):
        if n.startswith("d"):
            k += 1
            names[j] = f"d{k}"
    return names


def behaviour_prior(mdp: ChainMDP, p_rare: float, p_follow: float, noise: float) -> torch.Tensor:
    """P (K, K), rows summing to 1: the transition matrix RL starts from (book/method.md)."""
    for key, v in (("p_rare", p_rare), ("p_follow", p_follow), ("noise", noise)):
        if not 0 <= v <= 1:
            raise ValueError(f"synthetic.{key} must be in [0, 1], got {v}")
    if noise == 0:
        raise ValueError("synthetic.noise must be > 0: L_0 = log P needs every entry of P positive")
    K, c, e = mdp.n_states, mdp.correct, mdp.easy
    target = np.full((K, K), 1.0 / K)
    target[mdp.start] = 0
    target[mdp.start, c[0]], target[mdp.start, e[0]] = p_rare, 1 - p_rare
    for i in range(mdp.horizon - 1):
        target[c[i]] = 0
        target[c[i], c[i + 1]], target[c[i], e[i + 1]] = p_follow, 1 - p_follow
        target[e[i]] = 0
        target[e[i], e[i + 1]] = 1
    return torch.tensor((1 - noise) * target + noise / K, dtype=torch.float32)


def optimal_values(mdp: ChainMDP, epsilon: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Backward induction (book/method.md): V (T+1, K), V[t, z] the optimal expected reward from
    state z after t steps when each step is uniform with probability ``epsilon``, and the greedy
    choice (T, K), argmax_z' E[z, z'] V[t+1, z'] (ties to the lowest index)."""
    if not 0 <= epsilon <= 1:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    K, T = mdp.n_states, mdp.horizon
    V = np.zeros((T + 1, K))
    greedy = np.zeros((T, K), dtype=int)
    V[T] = mdp.terminal_reward
    for t in range(T - 1, -1, -1):
        Q = np.where(mdp.edges, V[t + 1][None, :], 0.0)  # Q[z, z']: the value of moving z -> z'
        greedy[t] = Q.argmax(1)
        V[t] = (1 - epsilon) * Q.max(1) + epsilon * Q.mean(1)
    return V, greedy


def optimum(mdp: ChainMDP, epsilon: float = 0.0) -> float:
    """V*_eps = V_0(start): the best expected reward at this epsilon (an upper bound for the policy class)."""
    return float(optimal_values(mdp, epsilon)[0][0, mdp.start])


def prior_rates(cfg: Config, concentrations: Sequence[float] | None = None) -> pd.DataFrame:
    """The prior policy (L_0 = log P) before RL, at ``synthetic.concentration`` and at the LLM path's
    ``policy.concentration``: held-out reward, correct-chain and easy-path rates (eps = 0, Monte
    Carlo on ``synthetic.eval_samples`` chains)."""
    mdp, P = study_mdp(cfg)
    cs = concentrations or sorted({cfg.synthetic.concentration, cfg.policy.concentration})
    rows = []
    for c in cs:
        policy = TransitionPolicy(mdp.n_states, concentration=c)
        with torch.no_grad():
            policy.L.copy_(P.log())
        ev = make_evaluator(mdp, cfg.synthetic.eval_samples, cfg.seed)(policy, 0)
        rows.append({"concentration c": c, "chains": cfg.synthetic.eval_samples, "reward": ev["eval_reward"],
                     "on correct chain": ev["correct_chain"], "on easy path": ev["easy_path"]})
    return pd.DataFrame(rows)


def chain_rewards(mdp: ChainMDP, z: torch.Tensor) -> torch.Tensor:
    """r (N,) of latent chains z (N, T) (z_1..z_T; z_0 = start)."""
    if z.dim() != 2 or z.shape[1] != mdp.horizon:
        raise ValueError(f"chains must be (N, {mdp.horizon}), got {tuple(z.shape)}")
    E = torch.as_tensor(mdp.edges)
    prev = torch.cat([torch.full_like(z[:, :1], mdp.start), z[:, :-1]], 1)
    ok = E[prev, z].all(1)
    return torch.as_tensor(mdp.terminal_reward, dtype=torch.float32)[z[:, -1]] * ok


def rollout(policy: TransitionPolicy, mdp: ChainMDP, n: int, epsilon: float,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n chains of the policy: states (n, T+1, K) = s_0, a_1..a_T; log-actions (n, T, K); latent
    states z (n, T) = argmax a_t."""
    s = torch.zeros(n, policy.n_states)
    s[:, mdp.start] = 1
    states, logs = [s], []
    with torch.no_grad():
        for _ in range(mdp.horizon):
            log_a = policy.sample_log(states[-1], epsilon, generator)
            logs.append(log_a.float())
            states.append(log_a.exp().float())
    la = torch.stack(logs, 1)
    return torch.stack(states, 1), la, la.argmax(-1)


def make_sampler(policy: TransitionPolicy, mdp: ChainMDP) -> Sampler:
    """A ``ctrls.method.reinforce`` sampler: every question index is the one MDP; the chains of a question slot are
    drawn together from one generator seeded by the slot's seed (so not shard-invariant: the study
    runs in one process)."""
    def sample(questions: Sequence[int], sample_ids: Sequence[Sequence[int]], epsilon: float,
               seeds: Sequence[int]) -> list[Trajectory]:
        out = []
        for gi, (ids, seed) in enumerate(zip(sample_ids, seeds)):
            g = torch.Generator().manual_seed(stream_key(seed) & _MASK)
            states, logs, z = rollout(policy, mdp, len(ids), epsilon, g)
            r = chain_rewards(mdp, z)
            out += [Trajectory(states=states[i], reward=float(r[i]), group=gi, log_actions=logs[i])
                    for i in range(len(ids))]
        return out
    return sample


def make_evaluator(mdp: ChainMDP, n: int, seed: int):
    """evaluate(policy, step) for the Trainer: the Dirichlet policy itself (eps = 0) on n chains from
    one fixed generator (the same draws at every step: common random numbers), and the exact
    categorical entropy of its first step from s_0."""
    correct, easy = torch.tensor(mdp.correct), torch.tensor(mdp.easy)

    def evaluate(policy: TransitionPolicy, step: int) -> dict:
        g = torch.Generator().manual_seed(stream_key(seed, 104729) & _MASK)
        states, _, z = rollout(policy, mdp, n, 0.0, g)
        r = chain_rewards(mdp, z)
        with torch.no_grad():
            h0 = float(policy.entropy(states[0, 0], kind="categorical"))
        return {"eval_reward": float(r.mean()), "correct_chain": float((z == correct).all(1).float().mean()),
                "easy_path": float((z == easy).all(1).float().mean()), "start_entropy": h0,
                "state_usage_entropy": state_usage_entropy(z.flatten().tolist(), mdp.n_states),
                "concentration": float(policy.log_c.detach().exp())}
    return evaluate


def study_mdp(cfg: Config) -> tuple[ChainMDP, torch.Tensor]:
    """The MDP and the prior P of ``cfg.synthetic``."""
    sy = cfg.synthetic
    mdp = reasoning_chain(sy.n_states, sy.horizon, sy.easy_reward)
    return mdp, behaviour_prior(mdp, sy.p_rare, sy.p_follow, sy.noise)


# ---- L recovery ------------------------------------------------------------------------------


def sample_chains(P: torch.Tensor, n: int, length: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """n state sequences (n, length) of the Markov chain P, each from a uniformly drawn start (so
    that every row of P is visited)."""
    K = P.shape[0]
    z = [torch.randint(K, (n,), generator=generator)]
    for _ in range(length - 1):
        z.append(torch.multinomial(P[z[-1]], 1, generator=generator).squeeze(1))
    return torch.stack(z, 1)


def transition_error(L: torch.Tensor, P: torch.Tensor) -> tuple[float, float]:
    """(mean, max) over rows of the total-variation distance between softmax(L) and P."""
    tv = 0.5 * (torch.softmax(L.double(), -1) - P.double()).abs().sum(-1)
    return float(tv.mean()), float(tv.max())


def fit_from_chains(chains: torch.Tensor, n_states: int, cfg: Config) -> torch.Tensor:
    """L fitted by ``fit_transitions`` (the pretraining stage's fit, with its config) on the
    one-hot consecutive pairs of the chains."""
    eye = torch.eye(n_states)
    prev, nxt = eye[chains[:, :-1].reshape(-1)], eye[chains[:, 1:].reshape(-1)]
    L, _ = fit_transitions(prev, nxt, n_states, steps=cfg.policy.fit_steps, lr=cfg.policy.fit_lr,
                           smoothing=cfg.policy.count_smoothing, method=cfg.policy.fit)
    return L


def recovery_study(cfg: Config, P: torch.Tensor | None = None) -> pd.DataFrame:
    """Fit L on n chains of length T + 1 sampled from P, for every n of
    ``synthetic.recovery_chains`` and seed of ``synthetic.seeds``: the mean and max row TV error."""
    if P is None:
        P = study_mdp(cfg)[1]
    rows = []
    for seed in cfg.synthetic.seeds:
        for n in cfg.synthetic.recovery_chains:
            g = torch.Generator().manual_seed(stream_key(cfg.seed, seed, n, 31) & _MASK)
            L = fit_from_chains(sample_chains(P, n, cfg.synthetic.horizon + 1, g), P.shape[0], cfg)
            mean, worst = transition_error(L, P)
            rows.append({"chains": n, "transitions": n * cfg.synthetic.horizon, "seed": seed,
                         "mean_tv": mean, "max_tv": worst})
    return pd.DataFrame(rows)


# ---- analysis: per-run summaries, the four settings, the sweep, the paper's claims ---------------


def run_summary(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per run (setting, eps, alpha, seed): held-out reward, correct-chain and easy-path
    rates and start-state entropy at the first and last evaluation, the mean held-out reward over
    all evaluations (area under the curve / steps), the policy entropy over visited states in the
    first and last 10 training steps, and whether the final policy is on the correct chain or on
    the easy path (more than half of the evaluation chains)."""
    keys = ["setting", "epsilon", "alpha", "seed"]
    ev = curves[curves.kind == "eval"].sort_values("step")
    tr = curves[curves.kind == "train"].sort_values("step")
    g = ev.groupby(keys)
    out = pd.DataFrame({
        "reward_first": g.eval_reward.first(), "reward_final": g.eval_reward.last(), "reward_mean": g.eval_reward.mean(),
        "correct_final": g.correct_chain.last(), "easy_final": g.easy_path.last(),
        "start_entropy_first": g.start_entropy.first(), "start_entropy_final": g.start_entropy.last(),
        "concentration_final": g.concentration.last()})
    t = tr.groupby(keys)
    out["policy_entropy_first"] = t.policy_entropy.apply(lambda v: v.head(10).mean())
    out["policy_entropy_final"] = t.policy_entropy.apply(lambda v: v.tail(10).mean())
    out["train_reward_final"] = t.reward.apply(lambda v: v.tail(20).mean())
    out["found"] = out.correct_final > 0.5
    out["on_easy"] = out.easy_final > 0.5
    return out.reset_index()


def optima(cfg: Config, epsilons: Sequence[float] | None = None) -> pd.DataFrame:
    """V*_eps (backward induction) for eps = 0, rl.epsilon and the sweep's epsilons."""
    mdp, _ = study_mdp(cfg)
    eps = sorted(set(epsilons if epsilons is not None else [0.0, cfg.rl.epsilon, *cfg.synthetic.epsilons]))
    return pd.DataFrame({"epsilon": eps, "optimum": [optimum(mdp, e) for e in eps]})


def _mean_range(v: pd.Series) -> str:
    return f"{v.mean():.3f} [{v.min():.3f}, {v.max():.3f}]"


def settings_table(summary: pd.DataFrame, cfg: Config) -> pd.DataFrame:
    """The paper's four settings: mean [min, max] over seeds of the final held-out reward (eps = 0;
    optimum 1) and of the last training reward (at the setting's eps; its optimum V*_eps), seeds on
    the correct chain / on the easy path, and the start-state entropy before and after RL."""
    opt = optima(cfg).set_index("epsilon").optimum
    rows = []
    for name in SETTINGS:
        s = summary[summary.setting == name]
        if s.empty:
            continue
        eps, alpha = s.epsilon.iloc[0], s.alpha.iloc[0]
        rows.append({"setting": name, "ε": eps, "α": alpha, "seeds": len(s),
                     "held-out reward (ε=0)": _mean_range(s.reward_final), "optimum (ε=0)": opt[0.0],
                     "training reward": _mean_range(s.train_reward_final), "optimum at ε": opt[eps],
                     "seeds on correct chain": int(s.found.sum()), "seeds on easy path": int(s.on_easy.sum()),
                     "start entropy before": round(float(s.start_entropy_first.mean()), 3),
                     "start entropy after": _mean_range(s.start_entropy_final)})
    return pd.DataFrame(rows)


def sweep_table(summary: pd.DataFrame, value: str = "reward_final") -> pd.DataFrame:
    """Mean over seeds of ``value`` (default: the final held-out reward) on the eps x alpha grid."""
    return summary.pivot_table(index="epsilon", columns="alpha", values=value, aggfunc="mean").rename_axis(
        index="ε", columns="α")


# ---- figures ------------------------------------------------------------------------------------


