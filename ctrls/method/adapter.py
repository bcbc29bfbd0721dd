"""P_omega: the U-Net adapter that conditions generation on the latent state (Eq. 8).

    E'_{t,i} = E_{t,i} + F_u( GELU([F_d(E_{t,i}); W_z z_t]) )

F_d: d -> r, W_z: D -> r (D = k*d, the space of Eq. 5), F_u: 2r -> d (linear, or an MLP with
``fusion="mlp"``). F_u's output layer starts at zero, so a fresh adapter returns E bit for bit in every
dtype (the weights stay float32; E' is cast back to E's dtype). ``forward_s`` takes z = s Gamma as s,
never building an (n, D) tensor. ``adapted_logits`` computes the logits at either injection point, but only
``"last_hidden"`` (before the LM head, backbone untouched, features cached) is wired into the stages;
the config refuses ``input_embeds`` (ctrls.config.schema, INJECT_AT_WHY). Parameter counts and the
injection point: book/method.md, "ctrls/method/adapter.py"; design notes: book/design.md.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ctrls.method.backbone import decoder_body

INJECTION_POINTS = ("last_hidden", "input_embeds")
FUSIONS = ("linear", "mlp")


class StateAdapter(torch.nn.Module):
    """E' = E + F_u(GELU([F_d(E); W_z z])) (Eq. 8), rank ``rank``, F_u's output layer zero-initialised.

    ``hidden_size`` is d, ``state_dim`` is D = k d (the dimension of z_t and of the centroids).

    ``fusion`` says what F_u is. The paper does not (Eq. 8 writes F_u([F_d(E); W_z z])):
    - ``"linear"``: F_u(h) = U h + b. Then E' = A(E) + u(z) separates (``ctrls.method.elbo.state_token_logprobs``):
      the state adds one vector per state to every position, a logit bias that cannot depend on the
      context;
    - ``"mlp"`` (ours): F_u(h) = U GELU(M h + m) + b with M (2r x 2r) mixing the token's code F_d(E)
      with the state's code W_z z before the nonlinearity, so the state's effect depends on the
      token's (contextual) hidden state. It costs 4r^2 + 2r more parameters.
    """

    def __init__(self, hidden_size: int, state_dim: int, rank: int = 64, fusion: str = "linear"):
        super().__init__()
        if fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r}: {' or '.join(FUSIONS)}")
        self.fusion = fusion
        self.down = torch.nn.Linear(hidden_size, rank)  # F_d
        self.state = torch.nn.Linear(state_dim, rank, bias=False)  # W_z
        self.mix = torch.nn.Linear(2 * rank, 2 * rank) if fusion == "mlp" else None  # M (mlp only)
        self.up = torch.nn.Linear(2 * rank, hidden_size)  # F_u's output layer
        torch.nn.init.zeros_(self.up.weight)  # F_u = 0: a fresh adapter returns E, the backbone's own logits
        torch.nn.init.zeros_(self.up.bias)

    @property
    def separable(self) -> bool:
        """True when E' = A(E) + u(z) (linear F_u): the state's effect does not depend on the token."""
        return self.fusion == "linear"

    @property
    def hidden_size(self) -> int:
        return self.down.in_features

    @property
    def state_dim(self) -> int:
        return self.state.in_features

    @property
    def rank(self) -> int:
        return self.down.out_features

    @staticmethod
    def n_params(hidden_size: int, state_dim: int, rank: int, fusion: str = "linear") -> int:
        """r(d + 1) + rD + 2rd + d: F_d, W_z, F_u (book/method.md gives concrete numbers);
        plus 4r^2 + 2r for the ``mlp`` fusion's M."""
        mix = 4 * rank * rank + 2 * rank if fusion == "mlp" else 0
        return rank * (hidden_size + 1) + rank * state_dim + 2 * rank * hidden_size + hidden_size + mix

    # ---- the state code W_z z (..., r) ------------------------------------------------------------
    def state_code(self, z: torch.Tensor) -> torch.Tensor:
        """W_z z for z (..., D)."""
        if z.shape[-1] != self.state_dim:
            raise ValueError(f"z has last dimension {z.shape[-1]}, the adapter expects D = {self.state_dim}")
        return self.state(z.to(self.state.weight.dtype))

    def mixture_code(self, s: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
        """W_z (s Gamma) = s (Gamma W_z^T) for s (..., K) and centroids Gamma (K, D)."""
        if centroids.dim() != 2 or centroids.shape[1] != self.state_dim:
            raise ValueError(f"centroids must be (K, {self.state_dim}), got {tuple(centroids.shape)}")
        if s.shape[-1] != centroids.shape[0]:
            raise ValueError(f"s has {s.shape[-1]} states on its last dimension, centroids have K = {centroids.shape[0]}")
        proj = self.state(centroids.to(self.state.weight.dtype))  # (K, r)
        return s.to(proj.dtype) @ proj

    # ---- E' -------------------------------------------------------------------------------------------
    def fuse(self, E: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        """E' = E + F_u(GELU([F_d(E); code])) for E (..., n, d) and a state code (..., n or 1, r)."""
        if E.shape[-1] != self.hidden_size:
            raise ValueError(f"E has last dimension {E.shape[-1]}, the adapter expects d = {self.hidden_size}")
        x = E.to(self.down.weight.dtype)
        try:
            code = code.to(x.dtype).expand(*x.shape[:-1], self.rank)
        except RuntimeError:
            raise ValueError(f"the state (code shape {tuple(code.shape)}) does not broadcast to the hidden "
                             f"states {tuple(E.shape)}: give one state per position or (..., 1, ·)") from None
        h = F.gelu(torch.cat([self.down(x), code], dim=-1))
        if self.mix is not None:  # the mlp fusion: the token's and the state's codes interact
            h = F.gelu(self.mix(h))
        return (x + self.up(h)).to(E.dtype)  # Eq. 8

    def forward(self, E: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """E (..., n, d), z (..., n, D) or broadcastable (..., 1, D) -> E' (..., n, d) in E's dtype."""
        return self.fuse(E, self.state_code(z))

    def forward_s(self, E: torch.Tensor, s: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
        """The same with z = s @ centroids, for s (..., n or 1, K): no (n, D) tensor is built."""
        return self.fuse(E, self.mixture_code(s, centroids))


def adapted_logits(model: torch.nn.Module, adapter: StateAdapter, input_ids: torch.Tensor,
                   s: torch.Tensor | None = None, centroids: torch.Tensor | None = None,
                   attention_mask: torch.Tensor | None = None, inject_at: str = "last_hidden", *,
                   z: torch.Tensor | None = None) -> torch.Tensor:
    """Logits (B, S, V) of the frozen causal LM ``model`` with the adapter applied at ``inject_at``.

    The state of each position is either a mixture ``s`` (B, S, K) with ``centroids`` (K, D), or a
    dense ``z`` (B, S, D) (keyword); (B, 1, ·) applies one state to every position. The design notes' (book/design.md)
    position rule decides which state a position carries: the positions a-1 .. b-2 that predict
    step t's tokens a .. b-1 carry z_t.
    """
    if inject_at not in INJECTION_POINTS:
        raise ValueError(f"unknown inject_at {inject_at!r}: {' or '.join(INJECTION_POINTS)}")
    if (z is not None and (s is not None or centroids is not None)) or (z is None and (s is None or centroids is None)):
        raise ValueError("give either z, or both s and centroids")
    for key in ("final_logit_softcapping", "logit_scale"):  # applied outside the LM head: not reproduced here
        if getattr(getattr(model, "config", None), key, None) not in (None, 1.0):
            raise NotImplementedError(f"{type(model).__name__} post-processes its logits ({key}); "
                                      f"adapted_logits supports plain LM heads only")

    def adapt(E: torch.Tensor) -> torch.Tensor:
        return adapter(E, z) if z is not None else adapter.forward_s(E, s, centroids)

    body = decoder_body(model)  # the transformer body (LlamaModel / Qwen2Model), final norm included
    head = model.get_output_embeddings()
    if inject_at == "last_hidden":
        h = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return head(adapt(h))
    emb = model.get_input_embeddings()(input_ids)
    h = body(inputs_embeds=adapt(emb), attention_mask=attention_mask, use_cache=False).last_hidden_state
    return head(h)
