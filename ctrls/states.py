"""Q_phi: k-means latent states and soft assignments (Sec. 5.2).

K centroids gamma_j are fitted by scikit-learn's KMeans on the spectral embeddings e_t of all
training steps (MiniBatchKMeans above ``minibatch_above`` steps). A step's state distribution is
s_t = softmax(-||e_t - gamma_j||^2 / tau) and its latent vector z_t = sum_j s_tj gamma_j. By default
tau is the median, over training steps, of the squared distance to the nearest centroid.

Fewer distinct steps than K: with ``reduce_k`` (the default) K is reduced to the number of distinct
steps, and the reduction is recorded in ``StateSpace.notes`` (saved in the checkpoint and shown on
the book page); without it, a ValueError.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from sklearn.cluster import KMeans, MiniBatchKMeans

log = logging.getLogger(__name__)


@dataclass
class StateSpace:
    centroids: torch.Tensor  # (K, D)
    tau: float
    requested_k: int
    notes: list[str] = field(default_factory=list)

    @property
    def k(self) -> int:
        return self.centroids.shape[0]

    def sq_dists(self, features: torch.Tensor) -> torch.Tensor:
        e = torch.as_tensor(features, dtype=torch.float32)
        return torch.cdist(e, self.centroids.to(e.device)).pow(2)

    def assign(self, features: torch.Tensor) -> torch.Tensor:
        """s (N, K) = softmax(-||e - gamma_j||^2 / tau)."""
        return torch.softmax(-self.sq_dists(features) / self.tau, dim=-1)

    def hard(self, features: torch.Tensor) -> torch.Tensor:
        return self.sq_dists(features).argmin(-1)

    def z(self, s: torch.Tensor) -> torch.Tensor:
        """z = s @ Gamma."""
        return s.to(self.centroids.dtype) @ self.centroids


def fit_states(features, n_states: int, seed: int = 0, minibatch_above: int = 20000, tau: float | None = None,
               reduce_k: bool = True, ids: Sequence[str] | None = None) -> StateSpace:
    """k-means over step embeddings (N, D); see the module docstring."""
    X = torch.as_tensor(features, dtype=torch.float32)
    bad = ~torch.isfinite(X).all(dim=1)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"NaN/Inf spectral feature at {ids[i] if ids else f'row {i}'} "
                         f"({int(bad.sum())} bad rows): check that step's hidden states")
    Xn = X.numpy().astype(np.float64)
    distinct = len(np.unique(Xn.round(8), axis=0))
    notes = []
    k = n_states
    if distinct < n_states:
        if not reduce_k:
            raise ValueError(f"{distinct} distinct steps cannot make {n_states} states: collect more "
                             f"trajectories, lower states.n_states, or set states.reduce_k=true")
        k = max(1, distinct)
        notes.append(f"Only {distinct} distinct training steps for K = {n_states} requested states: "
                     f"K was reduced to {k}.")
        log.warning(notes[-1])
    if len(Xn) > minibatch_above:
        km = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=3, batch_size=4096)
    else:
        km = KMeans(n_clusters=k, random_state=seed, n_init=4)
    km.fit(Xn)
    centroids = torch.as_tensor(km.cluster_centers_, dtype=torch.float32)
    space = StateSpace(centroids=centroids, tau=1.0, requested_k=n_states, notes=notes)
    if tau is None:
        d2 = space.sq_dists(X).min(dim=1).values
        tau = float(torch.quantile(d2.double(), 0.5))
        if tau <= 0:
            nz = d2[d2 > 0]
            tau = float(nz.mean()) if len(nz) else 1.0
            notes.append(f"The median squared distance to the nearest centroid is 0; tau = {tau:.4g} instead.")
    space.tau = float(tau)
    return space
