"""Diagnostic (not a speed benchmark): Thm. 5.3's bound under the two transition fits.

The bound (``ctrls.method.elbo``) is reconstruction - expected KL; only the expected KL depends on L. This
script draws soft state pairs (K = 8 by default) from a known sticky chain, fits L on ``--pairs``
training pairs both ways, and reports the expected KL per step (the bound's L-dependent part; the
bound moves by minus its change) on those pairs and on as many held-out pairs of the same chain:

- "mixture": ``fit_transitions(method="mixture")``, the old default (300 Adam steps, lr 0.05, from
  the soft counts), which minimises the mixture-prior KL, not the theorem's term;
- "expected_kl": the new default, the closed-form minimiser of the expected KL (smoothing 0.1).

    python studies/transition_fit.py [--pairs 3000] [--states 8] [--seed 0]

With ``--run-states PATH`` (a pretraining run's ``states/states.pt``, e.g. the demo's under
``runs/demo/``) it uses that run's soft state pairs instead of the synthetic chain: the fit on the
run's training steps, the expected KL on its training and held-out steps (the split of the run), so
the difference is the change of the demo's reported bound per step, train and held-out, between the
old and the new default fit (the reconstruction term does not depend on L).
"""
from __future__ import annotations

import argparse
import json

import torch

from ctrls.method.policy import expected_kl, fit_transitions


def soft_pairs(n: int, K: int, A: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n pairs: s_prev ~ Dir(0.3), s_next ~ Dir(5 s_prev A + 0.05) (soft states around the chain A)."""
    prev = torch.distributions.Dirichlet(torch.full((K,), 0.3, dtype=torch.float64)).sample((n,))
    nxt = torch.stack([torch.distributions.Dirichlet(5 * (p @ A) + 0.05).sample() for p in prev])
    return prev.float(), nxt.float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3000)
    ap.add_argument("--states", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-states", default=None, help="a pretraining run's states/states.pt")
    args = ap.parse_args()
    if args.run_states:
        from ctrls.stages.pretrain import transition_pairs
        from ctrls.stages.runs import load_torch

        st = load_torch(args.run_states, weights_only=True)
        prev, nxt = transition_pairs(st)
        h = st["heldout"]
        train, held = (prev[~h], nxt[~h]), (prev[h], nxt[h])
        K = st["s_post"].shape[1]
        out = {"states": args.run_states, "K": K, "train pairs": int((~h).sum()), "heldout pairs": int(h.sum())}
        report(out, train, held, K)
        return
    torch.manual_seed(args.seed)  # torch.distributions draws from the global RNG
    g = torch.Generator().manual_seed(args.seed)
    K = args.states
    A = torch.softmax(2 * torch.randn(K, K, generator=g, dtype=torch.float64), -1)
    train, held = soft_pairs(args.pairs, K, A, g), soft_pairs(args.pairs, K, A, g)
    out = {"pairs": args.pairs, "K": K, "seed": args.seed}
    report(out, train, held, K)


def report(out: dict, train, held, K: int) -> None:
    for method in ("mixture", "expected_kl"):
        L, _ = fit_transitions(*train, K, method=method)
        for split, (prev, nxt) in (("train", train), ("heldout", held)):
            out[f"{method} {split} expected KL / step"] = round(float(expected_kl(nxt, prev, L).mean()), 4)
    for split in ("train", "heldout"):
        out[f"bound gain / step, {split} (nats)"] = round(out[f"mixture {split} expected KL / step"]
                                                          - out[f"expected_kl {split} expected KL / step"], 4)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
