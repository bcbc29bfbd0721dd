"""Alg. 2: on-policy REINFORCE of the transition policy (Eq. 16), adapter and backbone frozen.

For each question x_0, G trajectories are sampled with the epsilon-greedy policy pi~_theta at
temperature eta; each trajectory tau = (s_0, a_1, ..., a_T) earns R = 1{y = y*}. The objective is

    J(theta) = E_tau[ R(tau) + alpha * sum_t H(pi_theta(s_t)) ]                       (Eq. 15; H is Eq. 14)

and the REINFORCE estimator (Eq. 16) weights sum_t grad log pi~_theta(a_t | s_t) by the return
R + alpha * sum_t H. H depends on theta directly too; ``rl.entropy_grad = "full"`` (default) adds
that pathwise term alpha * sum_t grad H, which makes the estimate the exact gradient of J;
``"eq16"`` uses Eq. 16's score-function term alone. The paper's plain estimator (no baseline) is
the default; ``rl.baseline = group_mean`` subtracts, from each trajectory's return, the mean return
of the *other* trajectories of its question's group (leave-one-out). The baseline then does not
depend on the trajectory's own actions, so E[b grad log pi~(tau)] = 0 and the estimator stays
unbiased; a mean that includes the trajectory's own return scales the expected gradient by
(G - 1) / G (0.5 at G = 2). A trajectory alone in its group gets no baseline.

Only L and c (the policy) receive gradients; the training loop is ``ctrls.stages.trainer``.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ctrls.method.policy import NonFiniteError, TransitionPolicy

log = logging.getLogger(__name__)


@dataclass
class Trajectory:
    """What REINFORCE needs of one sampled chain: its states and its reward."""

    states: torch.Tensor  # (T+1, K): s_0, a_1, ..., a_T
    reward: float
    group: int  # index of its question in the step's batch
    log_actions: torch.Tensor | None = None  # (T, K): log a_1, ..., log a_T, exact (policy.sample_log)
    # (T, K) bool: the states each a_t was drawn over (a position mask, ctrls.method.positions; log a_t = -inf
    # elsewhere); None: all. log pi~ is then the density of the renormalised draw (TransitionPolicy.log_prob_log)
    allowed: torch.Tensor | None = None

    def __post_init__(self):
        if self.log_actions is not None and self.log_actions.shape != self.states[1:].shape:
            raise ValueError(f"log_actions {tuple(self.log_actions.shape)} do not match the actions "
                             f"{tuple(self.states[1:].shape)} of states")
        if self.allowed is not None and (self.log_actions is None or self.allowed.shape != self.log_actions.shape):
            raise ValueError("a trajectory's allowed states need its exact log_actions, of the same shape")

    def logs(self) -> torch.Tensor:
        """log a_1..a_T: the exact log-actions when kept, else log of the stored actions (then
        every a_j must be > 0; an action that underflowed to 0 is an error, never clamped)."""
        if self.log_actions is not None:
            return self.log_actions
        a = self.states[1:]
        if bool((a <= 0).any()):
            raise ValueError("a trajectory's action has an entry <= 0 and no log_actions were kept: "
                             "sample with policy.sample_log and pass log_actions (a clamp would bias Eq. 16)")
        return a.log()


# A sampler draws trajectories: for each question index, the given sample indices of its group,
# seeded by the question's seed (see ``ctrls.generate.sampling``): sampler(questions, sample_ids, epsilon, seeds).
Sampler = Callable[[Sequence[int], Sequence[Sequence[int]], float, Sequence[int]], list[Trajectory]]


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def reinforce_loss(policy: TransitionPolicy, trajs: Sequence[Trajectory], epsilon: float, alpha: float,
                   baseline: str = "none", entropy_grad: str = "full", entropy_kind: str = "categorical",
                   all_sum: Callable[[torch.Tensor], torch.Tensor] = _identity, n_groups: int | None = None
                   ) -> tuple[torch.Tensor, dict]:
    """The negated Eq. 16 surrogate, averaged over trajectories, and diagnostics (batched over
    trajectories of different lengths with a mask).

    Data parallel: each rank passes its own trajectories and ``all_sum`` (a sum over ranks, see
    ``ctrls.stages.distributed``); the loss is then this rank's share of the global mean, so summing the
    ranks' gradients gives the single-process gradient. Every rank makes the same ``all_sum``
    calls in the same order, whatever its trajectories."""
    if baseline not in ("none", "group_mean"):
        raise ValueError(f"unknown baseline {baseline!r}: none or group_mean")
    if entropy_grad not in ("full", "eq16"):
        raise ValueError(f"unknown entropy_grad {entropy_grad!r}: full or eq16")
    bad = [i for i, tr in enumerate(trajs) if not math.isfinite(tr.reward)]
    if bad or not math.isfinite(alpha):
        raise NonFiniteError(f"reinforce_loss: trajectory {bad[0]} has reward {trajs[bad[0]].reward!r}" if bad
                             else f"reinforce_loss: alpha is {alpha!r}")
    dev = policy.L.device
    used = [tr for tr in trajs if len(tr.states) > 1]
    K = policy.n_states
    T = max([len(tr.states) for tr in used], default=1) - 1
    S = torch.full((len(used), T + 1, K), 1.0 / K)
    LA = torch.full((len(used), T, K), -math.log(K))  # log-actions; padding is masked out
    mask = torch.zeros(len(used), T)
    AL = torch.ones((len(used), T, K), dtype=torch.bool) if any(tr.allowed is not None for tr in used) else None
    for i, tr in enumerate(used):
        S[i, : len(tr.states)] = tr.states
        LA[i, : len(tr.states) - 1] = tr.logs()
        mask[i, : len(tr.states) - 1] = 1
        if tr.allowed is not None:
            AL[i, : len(tr.states) - 1] = tr.allowed
    S, LA, mask = S.to(dev), LA.to(dev), mask.to(dev)
    prev, log_act = S[:, :-1].reshape(-1, K), LA.reshape(-1, K)
    allowed = None if AL is None else AL.reshape(-1, K).to(dev)
    # Eq. 16: sum_t log pi~(a_t | s_t)
    logp = (policy.log_prob_log(log_act, prev, epsilon, allowed=allowed).view(len(used), T) * mask).sum(1)
    H = (policy.entropy(prev, kind=entropy_kind).view(len(used), T) * mask).sum(1)  # sum_t H(pi(s_t))
    ret = torch.tensor([tr.reward for tr in used], device=dev, dtype=logp.dtype) + alpha * H.detach()
    n_used = float(all_sum(torch.tensor(float(len(used)), device=dev)))
    if n_used == 0:
        raise ValueError("no trajectory has a state transition: nothing to learn from")
    adv = ret
    if baseline == "group_mean":
        g = torch.tensor([tr.group for tr in used], device=dev, dtype=torch.long)
        size = n_groups if n_groups is not None else int(g.max()) + 1 if len(g) else 0  # pass n_groups when sharded
        means = all_sum(torch.zeros(size, device=dev, dtype=ret.dtype).index_add(0, g, ret))
        counts = all_sum(torch.zeros(size, device=dev, dtype=ret.dtype).index_add(0, g, torch.ones_like(ret)))
        # leave-one-out: the mean return of the group's other trajectories (unbiased; module docstring)
        others = (counts[g] - 1).clamp(min=1)
        adv = ret - torch.where(counts[g] > 1, (means[g] - ret) / others, torch.zeros_like(ret))
    surrogate = (adv * logp).sum() / n_used
    if entropy_grad == "full":
        surrogate = surrogate + alpha * H.sum() / n_used
    sums = all_sum(torch.tensor([sum(t.reward for t in trajs), float(len(trajs)), float(ret.sum()),
                                 float((H.detach() / mask.sum(1).clamp(min=1)).sum())], device=dev, dtype=torch.float64))
    info = {"reward": float(sums[0] / sums[1]), "return": float(sums[2]) / n_used, "policy_entropy": float(sums[3]) / n_used}
    return -surrogate, info


def state_usage_entropy(hard_states: Sequence[int], K: int) -> float:
    """Entropy (nats) of the empirical distribution of the states visited."""
    if len(hard_states) == 0:
        return math.nan
    p = np.bincount(np.asarray(hard_states), minlength=K) / len(hard_states)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


# ---- the RL stage on a real backbone -------------------------------------------------------------


