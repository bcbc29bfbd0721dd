"""The CTRLS model: inference model Q_phi, transition policy P_theta / pi_theta, and adapter omega.

- Q_phi (Sec. 5.2): the spectral embedding e_t of a step's hidden states (Eq. 5), softly assigned
  to k-means centroids gamma_j: s_t = softmax(-||e_t - gamma_j||^2 / tau), z_t = s_t Gamma.
- P_theta / pi_theta (Sec. 5.3, 5.4): ``TransitionPolicy`` (K x K logits L and concentration c).
- P_omega (Eq. 8): ``StateAdapter`` on the frozen backbone's last hidden state.

A checkpoint directory holds ``config.json`` and ``model.safetensors`` (centroids, tau, L, c and
the adapter), and reloads with ``CTRLSModel.from_pretrained(path, backbone)``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save_file

from ctrls.method.adapter import StateAdapter
from ctrls.method.policy import TransitionPolicy
from ctrls.method.spectral import spectral_embeddings
from ctrls.method.states import StateSpace


@dataclass
class CTRLSConfig:
    hidden_size: int
    n_states: int  # K actually used (may be below the requested K, see states.py)
    requested_states: int
    spectral_k: int
    spectral_normalize: bool
    tau: float
    rank: int
    inject_at: str = "last_hidden"
    fusion: str = "linear"  # F_u of Eq. 8: linear (separable) or mlp (ctrls.method.adapter.StateAdapter)
    hidden_layer: int = -1
    backbone: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def state_dim(self) -> int:
        return self.spectral_k * self.hidden_size


class CTRLSModel(torch.nn.Module):
    """Q_phi + P_theta/pi_theta + adapter around a frozen backbone (which it does not own)."""

    def __init__(self, config: CTRLSConfig, centroids: torch.Tensor, policy: TransitionPolicy, adapter: StateAdapter):
        super().__init__()
        self.config = config
        self.register_buffer("centroids", centroids.float())
        self.policy = policy
        self.adapter = adapter

    # ---- Q_phi ----------------------------------------------------------------------------
    def embed(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """Spectral embeddings e_t (N, k*d) of steps' hidden states (Eq. 5)."""
        return spectral_embeddings(hidden, self.config.spectral_k, self.config.spectral_normalize)

    @property
    def states(self) -> StateSpace:
        """Q_phi's state space (centroids, tau, the fit's record), on the model's device."""
        return StateSpace(self.centroids, self.config.tau, self.config.requested_states, list(self.config.notes))

    def assign(self, e: torch.Tensor) -> torch.Tensor:
        """Soft assignment s (N, K) = softmax(-||e - gamma_j||^2 / tau) (``StateSpace.assign``)."""
        return self.states.assign(e)

    def encode(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """s_t = Q_phi(x_<=t) from each step's (or the prompt's) hidden states."""
        return self.assign(self.embed(hidden))

    def z(self, s: torch.Tensor) -> torch.Tensor:
        """z_t = sum_j s_tj gamma_j (``StateSpace.z``)."""
        return self.states.z(s)

    # ---- P_omega ----------------------------------------------------------------------------
    def adapt(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """E' for last hidden states ``h`` (B, d) or (B, n, d) given state distributions ``s`` (B, K)."""
        squeeze = h.dim() == 2
        hh = h[:, None] if squeeze else h
        out = self.adapter.forward_s(hh, s[:, None].expand(-1, hh.shape[1], -1), self.centroids)
        return out[:, 0] if squeeze else out

    # ---- persistence --------------------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(asdict(self.config), indent=1))
        tensors = {"centroids": self.centroids}
        tensors.update({f"policy.{k}": v for k, v in self.policy.state_dict().items()})
        tensors.update({f"adapter.{k}": v for k, v in self.adapter.state_dict().items()})
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
        return path

    @classmethod
    def from_pretrained(cls, path: str | Path, backbone=None, device: str | torch.device | None = None) -> "CTRLSModel":
        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        config = CTRLSConfig(**cfg)
        if backbone is not None and backbone.hidden_size != config.hidden_size:
            raise ValueError(f"checkpoint {path} was trained for hidden size {config.hidden_size}, "
                             f"backbone {backbone.name!r} has {backbone.hidden_size}")
        t = load_file(str(path / "model.safetensors"))
        model = cls.build(config, t["centroids"])
        model.policy.load_state_dict({k[7:]: v for k, v in t.items() if k.startswith("policy.")})
        model.adapter.load_state_dict({k[8:]: v for k, v in t.items() if k.startswith("adapter.")})
        dev = device or (backbone.device if backbone is not None else "cpu")
        return model.to(dev)

    @classmethod
    def build(cls, config: CTRLSConfig, centroids: torch.Tensor, concentration: float = 20.0,
              L: torch.Tensor | None = None) -> "CTRLSModel":
        policy = TransitionPolicy(config.n_states, concentration=concentration)
        if L is not None:
            with torch.no_grad():
                policy.L.copy_(L)
        adapter = StateAdapter(config.hidden_size, config.state_dim, config.rank, config.fusion)
        return cls(config, centroids, policy, adapter)

    @classmethod
    def random(cls, hidden_size: int, n_states: int = 16, spectral_k: int = 4, rank: int = 64, seed: int = 0,
               centroid_scale: float = 1.0, concentration: float = 20.0, adapter_std: float | None = 0.01,
               tau: float = 50.0) -> "CTRLSModel":
        """A CTRLS model with random weights, for tests and benchmarks (no fitting): centroids and
        transition logits L standard normal (centroids times ``centroid_scale``), drawn in that order
        after ``torch.manual_seed(seed)``; the adapter's output layer normal with ``adapter_std`` (None:
        the fresh adapter, which leaves the backbone's logits unchanged)."""
        torch.manual_seed(seed)
        conf = CTRLSConfig(hidden_size=hidden_size, n_states=n_states, requested_states=n_states, spectral_k=spectral_k,
                           spectral_normalize=True, tau=tau, rank=rank)
        centroids = torch.randn(n_states, spectral_k * hidden_size) * centroid_scale
        model = cls.build(conf, centroids, concentration=concentration, L=torch.randn(n_states, n_states))
        if adapter_std is not None:
            torch.nn.init.normal_(model.adapter.up.weight, std=adapter_std)
        return model
