"""P_omega: the U-Net adapter that conditions generation on the latent state (Eq. 7).

    E'_{t,i} = E_{t,i} + F_u( GELU([F_d(E_{t,i}); W_z z_t]) )

F_d: d -> r encodes the token's last hidden state into a rank-r bottleneck, W_z: D -> r projects
the state vector z_t (D = k*d, the spectral-embedding space), and F_u: 2r -> d decodes the fused
bottleneck back; the skip connection makes it a U-Net. F_u's weight and bias start at zero, so a
fresh adapter leaves the backbone's logits bit-identical. Parameters (``n_params``):
r(d + 1) + rD + 2rd + d = O(r(d + D)): 258,688 for SmolLM2-135M (d = 576, k = 4, r = 64),
919,616 for Qwen2.5-3B (d = 2048) and 1,379,392 for Llama-3.2-3B (d = 3072): under 0.05% of the
backbone.

With ``z = s Gamma`` (a mixture of centroids), W_z z = s (Gamma W_z^T): ``forward_s`` uses that
K x r product and never materialises an (n, D) tensor. Weights are float32; inputs of another
dtype (bf16 on GPU) are cast in and the output cast back.

The default injection point is the last hidden state, right before the LM head (DESIGN.md);
``adapted_logits(..., inject_at="input_embeds")`` applies the adapter to the input embeddings
instead, which backpropagates through the frozen backbone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class StateAdapter(torch.nn.Module):
    def __init__(self, hidden_size: int, state_dim: int, rank: int = 64):
        super().__init__()
        self.down = torch.nn.Linear(hidden_size, rank)  # F_d
        self.state = torch.nn.Linear(state_dim, rank, bias=False)  # W_z
        self.up = torch.nn.Linear(2 * rank, hidden_size)  # F_u, zero-initialised
        torch.nn.init.zeros_(self.up.weight)
        torch.nn.init.zeros_(self.up.bias)

    @staticmethod
    def n_params(hidden_size: int, state_dim: int, rank: int) -> int:
        return rank * (hidden_size + 1) + rank * state_dim + 2 * rank * hidden_size + hidden_size

    def _fuse(self, E: torch.Tensor, zr: torch.Tensor) -> torch.Tensor:
        x = E.to(self.down.weight.dtype)
        h = torch.cat([self.down(x), zr.to(x.dtype).expand(*x.shape[:-1], -1)], dim=-1)
        return (x + self.up(F.gelu(h))).to(E.dtype)

    def forward(self, E: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """E (..., n, d), z (..., n, D) or broadcastable (..., 1, D) -> E'."""
        return self._fuse(E, self.state(z.to(self.state.weight.dtype)))

    def forward_s(self, E: torch.Tensor, s: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
        """The same with z = s @ centroids, computed as s @ (centroids W_z^T)."""
        proj = self.state(centroids.to(self.state.weight.dtype))  # (K, r)
        return self._fuse(E, s.to(proj.dtype) @ proj)


def adapted_logits(model: torch.nn.Module, adapter: StateAdapter, input_ids: torch.Tensor,
                   s: torch.Tensor, centroids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   inject_at: str = "last_hidden") -> torch.Tensor:
    """Logits (B, S, V) of the frozen ``model`` with the adapter applied at ``inject_at``, where
    ``s`` (B, S, K) is the state distribution of each position (DESIGN.md's position rule)."""
    if inject_at not in ("last_hidden", "input_embeds"):
        raise ValueError(f"unknown inject_at {inject_at!r}: last_hidden or input_embeds")
    body = getattr(model, model.base_model_prefix)
    head = model.get_output_embeddings()
    if inject_at == "last_hidden":
        h = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return head(adapter.forward_s(h, s, centroids))
    emb = model.get_input_embeddings()(input_ids)
    h = body(inputs_embeds=adapter.forward_s(emb, s, centroids), attention_mask=attention_mask).last_hidden_state
    return head(h)
