"""The spectrum embedding of a reasoning step (Eq. 5).

The paper takes the top-k eigenpairs (lambda_i, q_i) of the d x d Gram matrix G_t = E_t^T E_t of a
step's token representations E_t (n_t x d) and sets e_t = [sqrt(lambda_1) q_1; ...; sqrt(lambda_k) q_k].
With the thin SVD E_t = U S V^T we have G_t = V S^2 V^T, so sqrt(lambda_i) q_i = s_i v_i: e_t is the
first k rows of S V^T, flattened (dimension k*d). That costs O(n_t^2 d) instead of O(d^3)
(d = 3072 for a 3B model, n_t ~ 40). We never form the d x d matrix: the thin SVD is computed
from its small side, E_t E_t^T = U S^2 U^T (n_t x n_t, float64), with S V^T = U^T E_t.

Conventions (DESIGN.md): each v_i's sign is fixed so that its largest-magnitude entry is positive;
rows beyond rank(E_t) (n_t < k) are zero; E_t is divided by sqrt(n_t) first (flag ``normalize``)
so that long steps do not dominate the clustering.
"""
from __future__ import annotations

from typing import Sequence

import torch


def _sign_fix(rows: torch.Tensor) -> torch.Tensor:
    """Flip each row (..., k, d) so that its largest-magnitude entry is positive."""
    idx = rows.abs().argmax(dim=-1, keepdim=True)
    sign = torch.sign(rows.gather(-1, idx))
    sign[sign == 0] = 1
    return rows * sign


def _check_finite(E: torch.Tensor, what: str) -> None:
    if not torch.isfinite(E).all():
        raise ValueError(f"{what} has NaN or Inf hidden states")


def spectral_embedding(E: torch.Tensor, k: int, normalize: bool = True) -> torch.Tensor:
    """e_t (k*d,) of one step's hidden states E (n, d)."""
    return spectral_embeddings([E], k, normalize)[0]


def spectral_embeddings(steps: Sequence[torch.Tensor], k: int, normalize: bool = True,
                        names: Sequence[str] | None = None) -> torch.Tensor:
    """e_t (N, k*d) for many steps, batched: steps are zero-padded to a common length per chunk
    (zero rows leave S V^T unchanged) and decomposed by one batched SVD."""
    if not steps:
        raise ValueError("no steps to embed")
    d = steps[0].shape[-1]
    out = torch.zeros(len(steps), k, d, dtype=torch.float32, device=steps[0].device)
    order = sorted(range(len(steps)), key=lambda i: steps[i].shape[0])
    chunk = 256
    for c in range(0, len(order), chunk):
        ids = order[c:c + chunk]
        n_max = max(1, max(steps[i].shape[0] for i in ids))
        batch = torch.zeros(len(ids), n_max, d, dtype=torch.float32, device=out.device)
        for j, i in enumerate(ids):
            E = steps[i].float()
            _check_finite(E, f"step {names[i] if names else i}")
            n = E.shape[0]
            if n == 0:
                continue
            batch[j, :n] = E / (n ** 0.5) if normalize else E
        rows = _top_rows(batch, k)
        out[ids] = rows
    return out.reshape(len(steps), k * d)


def _top_rows(batch: torch.Tensor, k: int) -> torch.Tensor:
    """First k rows of S V^T (b, k, d) of each (b, n, d) matrix, sign fixed, zero beyond its rank."""
    b, n, d = batch.shape
    # the small n x n side: E E^T = U S^2 U^T, and S V^T = U^T E
    gram = batch.double() @ batch.double().transpose(1, 2)
    evals, U = torch.linalg.eigh(gram)  # ascending
    evals, U = evals.flip(-1), U.flip(-1)
    m = min(k, n)
    rows = (U[..., :m].transpose(1, 2) @ batch.double())  # (b, m, d) = S V^T rows
    tol = evals[..., :1].clamp(min=0) * max(n, d) * torch.finfo(torch.float64).eps * 10
    rows = torch.where((evals[..., :m] > tol)[..., None], rows, torch.zeros_like(rows))
    rows = _sign_fix(rows).float()
    if m < k:
        rows = torch.cat([rows, rows.new_zeros(b, k - m, d)], dim=1)
    return rows
