"""The spectrum embedding of a reasoning step (Eq. 5).

e_t = [sqrt(lambda_1) q_1; ...; sqrt(lambda_k) q_k] from the top-k eigenpairs of G_t = E_t^T E_t is the
first k rows of S V^T of the thin SVD E_t = U S V^T, flattened (k*d): O(n_t^2 d), never a d x d matrix.
``spectral_embedding`` does one step by SVD; ``spectral_embeddings`` (the pipeline's) does many, by one
batched float64 ``eigh`` of the small n x n side E E^T per chunk of zero-padded steps.

Conventions (design notes: book/design.md): each row sigma_i v_i points along the step's token sum
E_t^T 1 (the largest-magnitude entry decides only where that projection vanishes, ``SIGN_COS_TOL``);
rows beyond the numerical rank are zero; E_t is divided by sqrt(n_t) first (``normalize``). Outputs are
float32 on the inputs' device. Derivation and reasons: book/method.md, "Latent states (Eq. 5)".
"""
from __future__ import annotations

from typing import Sequence

import torch

# singular values below max(n, d) * this * s_1 are zero: numpy's matrix_rank rule at float32, since the
# hidden states are float32 at best
RANK_RTOL_EPS = torch.finfo(torch.float32).eps
SIGN_COS_TOL = 1e-4  # below this |cos(row, token sum)| the sign falls back to the largest-magnitude entry


def _prepare(E: torch.Tensor, normalize: bool, name: str, d: int | None = None) -> torch.Tensor:
    """Check one step's hidden states (n, d); return them in float32 (float64 kept), divided by sqrt(n) if asked."""
    if E.dim() != 2:
        raise ValueError(f"step {name}: hidden states must be (n_tokens, d), got shape {tuple(E.shape)}")
    if E.shape[0] == 0:
        raise ValueError(f"step {name} has no tokens: its spectrum embedding is undefined")
    if d is not None and E.shape[1] != d:
        raise ValueError(f"step {name} has hidden size {E.shape[1]}, the other steps {d}")
    E = E.float() if E.dtype != torch.float64 else E
    if not torch.isfinite(E).all():
        bad = int((~torch.isfinite(E)).any(-1).nonzero()[0])
        raise ValueError(f"step {name} has NaN/Inf hidden states (first at token {bad}): "
                         f"check the backbone's dtype and that step's tokens")
    return E / E.shape[0] ** 0.5 if normalize else E


def _finish(rows: torch.Tensor, sv: torch.Tensor, k: int, size: torch.Tensor | int,
            token_sum: torch.Tensor) -> torch.Tensor:
    """Zero the rows (..., m, d) beyond the numerical rank (singular values sv (..., m), descending;
    ``size`` = max(n, d) of each step, broadcastable to sv[..., :1]), fix each row's sign (along the
    step's token sum ``token_sum`` (..., d); the largest-magnitude entry where that projection
    vanishes) and zero-pad to k rows (..., k, d)."""
    tol = sv[..., :1] * size * RANK_RTOL_EPS
    rows = torch.where((sv > tol)[..., None], rows, torch.zeros_like(rows))
    proj = (rows * token_sum[..., None, :]).sum(-1)  # sigma_i^2 u_i^T 1: the row's projection on E^T 1
    cos = proj / (rows.norm(dim=-1) * token_sum.norm(dim=-1, keepdim=True)).clamp_min(torch.finfo(rows.dtype).tiny)
    peak = rows.gather(-1, rows.abs().argmax(dim=-1, keepdim=True))[..., 0]
    flip = torch.where(cos.abs() >= SIGN_COS_TOL, cos < 0, peak < 0)
    rows = torch.where(flip[..., None], -rows, rows)
    if rows.shape[-2] < k:
        rows = torch.cat([rows, rows.new_zeros(*rows.shape[:-2], k - rows.shape[-2], rows.shape[-1])], dim=-2)
    return rows.float()


def spectral_embedding(E: torch.Tensor, k: int, normalize: bool = True) -> torch.Tensor:
    """e_t (k*d,) of one step's hidden states E (n, d) by its thin SVD (Eq. 5).

    The first k rows of S V^T (each along the token sum, zero beyond the rank), flattened. ``normalize`` divides
    E by sqrt(n) first. NaN/Inf in E raise a ValueError."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    E = _prepare(E, normalize, "0")
    n, d = E.shape
    _, S, Vh = torch.linalg.svd(E, full_matrices=False)
    m = min(k, S.shape[0])
    return _finish(S[:m, None] * Vh[:m], S[:m], k, max(n, d), E.sum(0)).reshape(k * d)  # Eq. 5: sqrt(lambda_i) q_i = sigma_i v_i


def spectral_embeddings(steps: Sequence[torch.Tensor], k: int, normalize: bool = True, batch_size: int = 64,
                        names: Sequence[str] | None = None) -> torch.Tensor:
    """e_t (N, k*d) for many steps' hidden states (n_t, d), in the order given (Eq. 5).

    Steps are sorted by length and processed ``batch_size`` at a time: zero-padded to the chunk's
    longest step, then one batched float64 ``eigh`` of the n x n matrices E E^T gives S^2 and U,
    and S V^T = U^T E. Equals ``spectral_embedding`` step by step (up to float32 rounding).
    ``names`` label the steps in error messages (e.g. "q12/s3"); by default their index."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if len(steps) == 0:
        raise ValueError("no steps to embed")
    if names is not None and len(names) != len(steps):
        raise ValueError(f"{len(names)} names for {len(steps)} steps")
    d = steps[0].shape[-1]
    dev = steps[0].device
    out = torch.zeros(len(steps), k, d, dtype=torch.float32, device=dev)
    order = sorted(range(len(steps)), key=lambda i: steps[i].shape[0])
    for c in range(0, len(order), batch_size):
        idx = order[c:c + batch_size]
        prepared = [_prepare(steps[i], normalize, names[i] if names is not None else str(i), d) for i in idx]
        n = max(E.shape[0] for E in prepared)
        batch = torch.zeros(len(idx), n, d, dtype=torch.float64, device=dev)
        for j, E in enumerate(prepared):
            batch[j, :E.shape[0]] = E
        evals, U = torch.linalg.eigh(batch @ batch.transpose(1, 2))  # ascending
        m = min(k, n)
        U_top = U[..., -m:].flip(-1)  # (b, n, m), descending
        sv = evals[..., -m:].flip(-1).clamp(min=0).sqrt()
        size = torch.tensor([[max(E.shape[0], d)] for E in prepared], dtype=sv.dtype, device=dev)
        out[idx] = _finish(U_top.transpose(1, 2) @ batch, sv, k, size, batch.sum(1))  # Eq. 5: S V^T = U^T E
    return out.reshape(len(steps), k * d)
