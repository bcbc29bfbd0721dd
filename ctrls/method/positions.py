"""Where a state can occur: the position mask of the state chains (not in the paper; book/design.md,
"States that mark a position").

With K = 4 on the demo some k-means states mark a position rather than a move: the restatement of the
question occurs at a chain's first step only, the answer line at its last. A policy that draws them
elsewhere asks for a step the chain cannot take there, and a row held at one of them for every step
(the fixed-s0 ablation) never ends. The mask is read off the pretraining chains: state k can occur at
step index t when at least ``floor`` of the chains' steps at t's position bucket are in state k
(buckets 0, 1, ..., B - 2 and ``>= B - 1``; a bucket's most frequent state is always allowed, and a
bucket no chain reaches allows every state). A draw is restricted to the allowed states by
renormalising the policy's action over them: for a Dirichlet action this is the Dirichlet of the
allowed coordinates (the aggregation property), and epsilon's flat Dirichlet the flat one of the allowed states.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PositionMask:
    """``allowed`` (B, K) bool: state k can occur at position bucket b; ``counts`` (B, K): the pretraining
    chains' steps per bucket and state."""

    allowed: torch.Tensor
    counts: torch.Tensor

    def __post_init__(self):
        a = torch.as_tensor(self.allowed)
        if a.ndim != 2 or tuple(torch.as_tensor(self.counts).shape) != tuple(a.shape):
            raise ValueError(f"a position mask needs allowed and counts of one shape (B, K), got "
                             f"{tuple(a.shape)} and {tuple(torch.as_tensor(self.counts).shape)}")
        empty = (~a.bool()).all(1).nonzero().flatten().tolist()
        if empty:  # a draw there would be NaN, and a held row would have no state to substitute
            raise ValueError(f"a position mask allows no state at position bucket(s) {empty}: every position needs one")

    @property
    def mode(self) -> torch.Tensor:
        """(B,) each bucket's most frequent state (the lowest on a tie; 0 for a bucket no chain reaches)."""
        return self.counts.argmax(1)

    @property
    def buckets(self) -> int:
        return int(self.allowed.shape[0])

    def bucket(self, t: int) -> int:
        """Step index t's bucket (0-based steps; the last bucket holds every t >= B - 1)."""
        return min(int(t), self.buckets - 1)

    def mask_log(self, log_a: torch.Tensor, t: int) -> torch.Tensor:
        """log a (..., K) restricted to the states allowed at step t, renormalised."""
        keep = self.allowed[self.bucket(t)].to(log_a.device)
        masked = log_a.masked_fill(~keep, float("-inf"))
        return masked - torch.logsumexp(masked, dim=-1, keepdim=True)

    def fixed(self, s0: int, steps: int) -> list[int]:
        """The fixed-s0 row's chain under the mask: s0 at every step where it can occur, the bucket's most
        frequent state where it cannot."""
        return [int(s0) if bool(self.allowed[self.bucket(t), s0]) else int(self.mode[self.bucket(t)])
                for t in range(steps)]

    def to_dict(self) -> dict:
        return {"allowed": self.allowed.int().tolist(), "mode": self.mode.tolist(), "counts": self.counts.tolist()}


def position_mask(step_index: torch.Tensor, states: torch.Tensor, n_states: int, buckets: int,
                  floor: float) -> PositionMask:
    """The mask of the module docstring from the pretraining chains' steps: ``step_index`` (N,) each step's
    0-based index in its chain, ``states`` (N,) its hard state in [0, K)."""
    t, s = torch.as_tensor(step_index).long().reshape(-1), torch.as_tensor(states).long().reshape(-1)
    if t.shape != s.shape:
        raise ValueError(f"step_index and states must be of one length, got {tuple(t.shape)} and {tuple(s.shape)}")
    if buckets < 1 or not 0.0 <= floor <= 1.0:
        raise ValueError(f"buckets must be >= 1 and floor in [0, 1], got {buckets} and {floor}")
    if len(t) and (int(t.min()) < 0 or int(s.min()) < 0 or int(s.max()) >= n_states):
        raise ValueError(f"step indices must be >= 0 and states in [0, {n_states}), got steps {int(t.min())}.. and "
                         f"states {int(s.min())}..{int(s.max())}")
    b = t.clamp(max=buckets - 1)
    counts = torch.zeros(buckets, n_states, dtype=torch.long).index_put_((b, s), torch.ones_like(s), accumulate=True)
    total = counts.sum(1, keepdim=True)
    allowed = (counts >= floor * total) & (counts > 0)  # a state no chain put there is never allowed (unless the bucket is empty)
    allowed[torch.arange(buckets), counts.argmax(1)] = True  # the bucket's most frequent state
    allowed[total[:, 0] == 0] = True  # no chain reaches this bucket: nothing to say, every state allowed
    return PositionMask(allowed, counts)


__all__ = ["PositionMask", "position_mask"]
