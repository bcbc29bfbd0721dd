"""Q_phi: k-means latent states and soft assignments (Sec. 5.2).

K centroids gamma_j are fitted by scikit-learn's KMeans on the spectral embeddings e_t (Eq. 5) of all
training steps (MiniBatchKMeans above ``minibatch_above`` steps); a step's state distribution is
s_t = softmax_j(-||e_t - gamma_j||^2 / tau) and its latent vector z_t = sum_j s_tj gamma_j. By default tau
is the median squared distance of a training step to its nearest centroid (fallbacks in ``notes``).

With fewer distinct steps than K, K is reduced (``reduce_k=True``, the default: ``StateSpace.requested_k``
keeps the K asked for, ``k`` is the K used, ``notes`` says so) or it is a ValueError; never duplicate
centroids. Overflowing features and non-finite assignments raise. Details: book/method.md, "ctrls/method/states.py".
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from sklearn.cluster import KMeans, MiniBatchKMeans

log = logging.getLogger(__name__)


TINY_TAU = 1e-8  # tau below this fraction of the median squared distance to the centroids is noted


def _check_features(X: torch.Tensor, ids: Sequence[str] | None = None, dim: int | None = None) -> None:
    if X.dim() != 2:
        raise ValueError(f"features must be (N, D), got shape {tuple(X.shape)}")
    if dim is not None and X.shape[1] != dim:
        raise ValueError(f"features have dimension {X.shape[1]}, the centroids {dim}")
    bad = ~torch.isfinite(X).all(dim=1)
    if bad.any():
        i = int(bad.nonzero()[0])
        where = ids[i] if ids is not None else f"row {i}"
        raise ValueError(f"NaN/Inf spectral feature at {where} ({int(bad.sum())} bad rows in all): "
                         f"check that step's hidden states")


def sq_dists(e: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """||e_i - gamma_j||^2 (N, K), from the differences: the ||e||^2 + ||gamma||^2 - 2 e.gamma shortcut
    (torch.cdist's default above 25 rows) loses the small distances of far-from-origin points."""
    return torch.cdist(e, centroids, compute_mode="donot_use_mm_for_euclid_dist").pow(2)


def soft_assign(d2: torch.Tensor, tau: float) -> torch.Tensor:
    """Q_phi's soft state s = softmax_j(-d2_j / tau) from squared distances to the centroids."""
    if not (0 < tau < float("inf")):
        raise ValueError(f"tau must be positive and finite, got {tau}")
    if not bool(torch.isfinite(d2).all()):
        raise ValueError(f"squared distances to the centroids overflow (max feature distance^2 = {float(d2.max())}): "
                         "the spectral features are too large for float32; check the hidden states or "
                         "keep spectral.normalize on")
    return torch.softmax(-d2 / tau, dim=-1)  # Sec. 5.2: Q_phi(z_t = gamma_j) = s_tj


@dataclass
class StateSpace:
    """The fitted Q_phi: centroids gamma (K, D), temperature tau, and the record of the fit."""

    centroids: torch.Tensor  # (K, D) float32
    tau: float
    requested_k: int  # the K asked for; ``k`` may be smaller (see the module docstring)
    notes: list[str] = field(default_factory=list)  # human-readable record of fallbacks

    @property
    def k(self) -> int:
        return self.centroids.shape[0]

    def sq_dists(self, features: torch.Tensor | np.ndarray) -> torch.Tensor:
        """||e - gamma_j||^2 (N, K), in float32; non-finite features raise a ValueError."""
        e = torch.as_tensor(features).to(device=self.centroids.device, dtype=torch.float32)
        _check_features(e, dim=self.centroids.shape[1])
        return sq_dists(e, self.centroids)

    def assign(self, features: torch.Tensor | np.ndarray) -> torch.Tensor:
        """s (N, K) = softmax_j(-||e - gamma_j||^2 / tau)."""
        return soft_assign(self.sq_dists(features), self.tau)

    def hard(self, features: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The nearest centroid (N,), i.e. argmax of ``assign``."""
        return self.sq_dists(features).argmin(-1)

    def z(self, s: torch.Tensor) -> torch.Tensor:
        """z (..., D) = sum_j s_j gamma_j = s @ Gamma."""
        return s.to(self.centroids.dtype) @ self.centroids

    def state_dict(self) -> dict[str, Any]:
        """{"centroids": tensor, "tau": float, "requested_k": int, "notes": list[str]}."""
        return {"centroids": self.centroids, "tau": float(self.tau), "requested_k": int(self.requested_k),
                "notes": list(self.notes)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "StateSpace":
        missing = {"centroids", "tau", "requested_k"} - set(state)
        if missing:
            raise ValueError(f"state space is missing {sorted(missing)}")
        centroids = torch.as_tensor(state["centroids"], dtype=torch.float32)
        if centroids.dim() != 2:
            raise ValueError(f"centroids must be (K, D), got shape {tuple(centroids.shape)}")
        return cls(centroids=centroids, tau=float(state["tau"]), requested_k=int(state["requested_k"]),
                   notes=list(state.get("notes", [])))


def _count_distinct(X: np.ndarray, at_least: int) -> int:
    """Number of distinct rows of X (exact equality, -0.0 == 0.0), counting no further than ``at_least``."""
    seen: set[bytes] = set()
    for row in X:
        seen.add(hashlib.blake2b((row + 0.0).tobytes(), digest_size=16).digest())
        if len(seen) >= at_least:
            break
    return len(seen)


def fit_states(features: torch.Tensor | np.ndarray, n_states: int, seed: int = 0, minibatch_above: int = 20000,
               tau: float | None = None, reduce_k: bool = True, ids: Sequence[str] | None = None) -> StateSpace:
    """Fit K = ``n_states`` k-means states to step embeddings (N, D) (see the module docstring).

    ``ids[i]`` labels row i in errors (e.g. "q12/s3"). ``tau=None``: the median rule. Fewer
    distinct rows than K: reduce K and record it (``reduce_k=True``) or raise a ValueError."""
    if n_states < 1:
        raise ValueError(f"n_states must be at least 1, got {n_states}")
    X = torch.as_tensor(features).detach().to("cpu", torch.float32)
    if ids is not None and len(ids) != len(X):
        raise ValueError(f"{len(ids)} ids for {len(X)} feature rows")
    _check_features(X, ids)
    if len(X) == 0:
        raise ValueError("no features to cluster")
    big = float(X.abs().max())
    if big > 1e18:  # (2 * 1e18)^2 already overflows float32 in a squared distance
        i = int(X.abs().max(dim=1).values.argmax())
        raise ValueError(f"spectral feature entries up to {big:.3g} (at {ids[i] if ids is not None else f'row {i}'}) "
                         "overflow float32 squared distances: check that step's hidden states, or keep "
                         "spectral.normalize on")
    Xn = np.ascontiguousarray(X.numpy())  # float32: sklearn keeps it, no float64 copy
    notes: list[str] = []
    k = n_states
    distinct = _count_distinct(Xn, n_states)
    if distinct < n_states:
        if not reduce_k:
            raise ValueError(f"{distinct} distinct steps cannot make {n_states} states: collect more trajectories, "
                             f"lower states.n_states, or set states.reduce_k=true")
        k = distinct
        notes.append(f"Only {distinct} distinct training steps for K = {n_states} requested states: "
                     f"K was reduced to {k}.")
        log.warning(notes[-1])
    if len(Xn) > minibatch_above:
        km = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=3, batch_size=4096)
    else:
        km = KMeans(n_clusters=k, random_state=seed, n_init=4)
    km.fit(Xn)
    space = StateSpace(centroids=torch.as_tensor(km.cluster_centers_, dtype=torch.float32), tau=1.0,
                       requested_k=n_states, notes=notes)
    if tau is None:
        d2 = space.sq_dists(X).min(dim=1).values.double()
        tau = float(np.median(d2.numpy()))
        if tau <= 0:
            nonzero = d2[d2 > 0]
            tau = float(nonzero.mean()) if len(nonzero) else 1.0
            notes.append(f"The median squared distance to the nearest centroid is 0: tau = {tau:.4g} "
                         f"({'mean of the nonzero distances' if len(nonzero) else 'all distances are 0'}).")
            log.warning(notes[-1])
    elif not (0 < tau < float("inf")):
        raise ValueError(f"tau must be positive and finite, got {tau}")
    all_d2 = space.sq_dists(X).double()
    if not bool(torch.isfinite(all_d2).all()) or not (0 < tau < float("inf")):
        raise ValueError(f"squared distances to the centroids overflow (tau = {tau}): the spectral features are "
                         "too large for float32; check the hidden states or keep spectral.normalize on")
    typical = float(all_d2.median())
    if typical > 0 and tau < TINY_TAU * typical:
        notes.append(f"tau = {tau:.3g} is below {TINY_TAU:g} of the median squared distance to the centroids "
                     f"({typical:.3g}): every soft assignment is one-hot to float precision.")
        log.warning(notes[-1])
    space.tau = float(tau)
    return space
