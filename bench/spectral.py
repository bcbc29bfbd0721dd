"""Spectrum embedding (Eq. 5): thin SVD vs the literal d x d Gram eigendecomposition.

For each hidden size d and step length n, N random steps with a decaying spectrum (like hidden
states: a few dominant directions plus noise) are embedded with k = 4 by
  - batched:  ``spectral_embeddings`` (batched float64 eigh of the small n x n side, what the
              pipeline uses), time per step;
  - per-step: ``spectral_embedding`` (torch.linalg.svd of each step), time per step;
  - dense:    what a user following the paper would write: ``torch.linalg.eigh(E^T E)`` (d x d,
              float32), top-k sqrt(lambda) q with the same sign rule; timed on 1 step
              (1 repeat for d >= 2048, it takes seconds on 2 cores).
Prints a table of medians, speed ratios (dense / ours) and the max abs difference to the dense
result, and, as its last line, a JSON object of the ratios. Run: ``python bench/spectral.py``.
"""
from __future__ import annotations

import json
import statistics
import time

import torch

from ctrls.method.spectral import spectral_embedding, spectral_embeddings

K = 4
N_STEPS = 16  # steps per cell for the batched route (5 repeats); the per-step route runs on the first 8 (3 repeats)
DS = (576, 2048, 3072)
NS = (20, 40, 80)


def median_time(fn, repeats: int):
    """(median seconds, last result) of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def dense_eigh(E: torch.Tensor, k: int) -> torch.Tensor:
    """Eq. 5 literally, in the data's precision: top-k eigenpairs of the d x d Gram matrix."""
    E = E / E.shape[0] ** 0.5
    lam, Q = torch.linalg.eigh(E.T @ E)
    rows = lam[-k:].flip(0).clamp(min=0).sqrt()[:, None] * Q[:, -k:].flip(1).T
    peak = rows.gather(-1, rows.abs().argmax(-1, keepdim=True))
    return torch.where(peak < 0, -rows, rows).reshape(-1)


def random_steps(n: int, d: int, count: int, g: torch.Generator) -> list[torch.Tensor]:
    scale = 4.0 * 0.5 ** torch.arange(8.0)  # 8 dominant directions, halving in strength
    basis = torch.randn(8, d, generator=g)
    return [(torch.randn(n, 8, generator=g) * scale) @ basis + torch.randn(n, d, generator=g) for _ in range(count)]


def main() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    warm = random_steps(8, 64, 4, g)  # warm up LAPACK's code paths
    spectral_embeddings(warm, K), spectral_embedding(warm[0], K), dense_eigh(warm[0], K)
    header = f"{'d':>5} {'n':>3} | {'batched ms':>10} {'per-step ms':>11} {'dense ms':>9} | " \
             f"{'dense/batched':>13} {'dense/per-step':>14} | {'max|diff| b':>11} {'max|diff| p':>11}"
    print(f"spectrum embedding, k = {K}, times per step (median), {torch.get_num_threads()} threads")
    print(header)
    print("-" * len(header))
    ratios: dict[str, float] = {}
    for d in DS:
        for n in NS:
            steps = random_steps(n, d, N_STEPS, g)
            t_batched, batched = median_time(lambda: spectral_embeddings(steps, K), 5)
            t_step, per_step = median_time(lambda: [spectral_embedding(E, K) for E in steps[:8]], 3)
            t_dense, ref = median_time(lambda: dense_eigh(steps[0], K), 1 if d >= 2048 else 3)
            t_batched, t_step = t_batched / N_STEPS, t_step / 8
            diff_b = float((batched[0] - ref).abs().max())
            diff_p = float((per_step[0] - ref).abs().max())
            r_b, r_p = t_dense / t_batched, t_dense / t_step
            ratios[f"d{d}_n{n}"] = round(r_b, 1)
            ratios[f"d{d}_n{n}_per_step"] = round(r_p, 1)
            print(f"{d:>5} {n:>3} | {t_batched * 1e3:>10.3f} {t_step * 1e3:>11.3f} {t_dense * 1e3:>9.1f} | "
                  f"{r_b:>12.1f}x {r_p:>13.1f}x | {diff_b:>11.2e} {diff_p:>11.2e}", flush=True)
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
