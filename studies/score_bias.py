"""Diagnostic (not a speed benchmark): the bias of Eq. 16's score under a clamped log-density.

Evaluating log pi~(a | s) at an action clamped to >= 1e-6 (the clamped variant measured here) moves
E[grad log pi~] away from 0 once pretraining has made many c p_j tiny. This script measures, side
by side on one sharp transition row (K = 16, 0.98 on the diagonal, c = 20):
- the mean of d log pi~ / d log c over draws of the policy's own sampler (truth: 0);
- the REINFORCE gradient dJ/d log c for a reward of 1 on every trajectory (truth: 0);
- the drift of c after Adam steps under a fair-coin reward that ignores the actions (truth: none
  in expectation), with the exact log-actions ("exact") and with the old clamp ("clamped").

    python studies/score_bias.py [--draws 20000] [--steps 150]
"""
from __future__ import annotations

import argparse
import json
import math
import platform

import torch

from ctrls.method.policy import TransitionPolicy
from ctrls.method.reinforce import Trajectory, reinforce_loss

K, T = 16, 3


def sharp(c: float = 20.0) -> TransitionPolicy:
    pol = TransitionPolicy(K, concentration=c)
    off = 0.02 / (K - 1)
    with torch.no_grad():
        pol.L.copy_(torch.full((K, K), math.log(off)) + torch.eye(K) * (math.log(0.98) - math.log(off)))
    return pol


def clamp_log(log_a: torch.Tensor) -> torch.Tensor:
    """What the old code evaluated: log of the action clamped to >= 1e-6 and renormalised."""
    a = log_a.exp().float().clamp(min=1e-6)
    return (a / a.sum(-1, keepdim=True)).log()


def chains(pol: TransitionPolicy, n: int, g: torch.Generator, clamped: bool) -> list[Trajectory]:
    s = torch.nn.functional.one_hot(torch.zeros(n, dtype=torch.long), K).float()
    states, logs = [s], []
    for _ in range(T):
        la = pol.sample_log(states[-1], 0.0, generator=g)
        logs.append(clamp_log(la) if clamped else la.float())
        states.append(la.exp().float())
    S, LA = torch.stack(states, 1), torch.stack(logs, 1)
    return [Trajectory(S[i], 0.0, 0, LA[i]) for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--group", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out: dict = {"machine": platform.processor() or platform.machine(), "draws": args.draws, "steps": args.steps}
    for mode in ("clamped", "exact"):
        pol = sharp()
        g = torch.Generator().manual_seed(0)
        s = torch.nn.functional.one_hot(torch.zeros(args.draws, dtype=torch.long), K).float()
        la = pol.sample_log(s, 0.0, generator=g)
        la = clamp_log(la) if mode == "clamped" else la
        per = []  # per-draw d log pi / d log c in 40 batches: mean and its standard error
        for part in la.chunk(40):
            pol.zero_grad()
            pol.log_prob_log(part, s[: len(part)], 0.0).mean().backward()
            per.append(float(pol.log_c.grad))
        per_t = torch.tensor(per, dtype=torch.float64)
        trajs = chains(pol, args.draws // T, g, mode == "clamped")
        for tr in trajs:
            tr.reward = 1.0
        loss, _ = reinforce_loss(pol, trajs, 0.0, 0.0)
        dJ = -float(torch.autograd.grad(loss, pol.log_c)[0])
        # coin-flip reward for `steps` Adam steps (lr 1e-2, as rl.lr)
        pol = sharp()
        opt = torch.optim.Adam(pol.parameters(), lr=1e-2)
        coin = torch.Generator().manual_seed(1)
        for _ in range(args.steps):
            trajs = chains(pol, args.group, g, mode == "clamped")
            for tr in trajs:
                tr.reward = float(torch.rand((), generator=coin) < 0.5)
            loss, _ = reinforce_loss(pol, trajs, 0.0, 0.0)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(pol.parameters(), 1.0)
            opt.step()
        out[mode] = {"mean_dlogpi_dlogc": float(per_t.mean()), "se": float(per_t.std() / math.sqrt(len(per_t))),
                     "dJ_dlogc_constant_reward": dJ, "c_after_coin_flip_training": float(pol.log_c.detach().exp()),
                     "c_start": 20.0}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
