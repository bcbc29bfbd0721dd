"""Counter-based random streams (splitmix64): every random number of a sample is a pure function of
(key, counter, index), the same on every device, in every batch and in every process.

``stream_key`` folds integers into a 64-bit key (scalar); ``stream_subkeys`` does the same for
tensors of keys and counters; ``stream_uniform`` hashes (key, counter, j) into float64 uniforms in
(0, 1). Token sampling (``sampling``) and state draws (``policy.sample_policy_log_streams``) use them,
so data-parallel sharding and lockstep batching reproduce a single run (book/design.md, "Streams").
"""
from __future__ import annotations

import zlib

import torch

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
M1, M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def signed(x: int) -> int:
    """x as a signed 64-bit integer (for int64 tensors)."""
    x &= MASK
    return x - (1 << 64) if x >> 63 else x


def stream_key(*parts: int) -> int:
    """A 64-bit stream key (signed, for int64 tensors) from integers, by chained splitmix64."""
    x = 0
    for p in parts:
        x = (x + (int(p) & MASK) + GOLDEN) & MASK
        x = ((x ^ (x >> 30)) * M1) & MASK
        x = ((x ^ (x >> 27)) * M2) & MASK
        x ^= x >> 31
    return signed(x)


def lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping multiplication)."""
    x = (x ^ lsr(x, 30)) * signed(M1)
    x = (x ^ lsr(x, 27)) * signed(M2)
    return x ^ lsr(x, 31)


def stream_uniform(keys: torch.Tensor, counters: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) float64 uniforms in (0, 1): entry j of row b is a hash of (keys[b], counters[b], j),
    the same on every device and in every batch."""
    base = mix(keys * signed(GOLDEN) + counters)
    j = torch.arange(1, width + 1, device=keys.device, dtype=torch.int64)
    x = mix(base[:, None] + j * signed(GOLDEN))
    return (lsr(x, 11).double() + 0.5) * 2.0 ** -53


def stream_subkeys(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """stream_key(keys[b], counters[b]) for every row (int64), vectorised (equal to ``stream_key``)."""
    g = signed(GOLDEN)
    return mix(mix(keys.to(torch.int64) + g) + counters.to(torch.int64) + g)


def seed_of(*parts) -> int:
    """A 32-bit seed from any tuple of plain values (crc32 of its repr): the per-step and per-question
    seeds of the stages, stable across processes and Python versions."""
    return zlib.crc32(repr(parts).encode())
