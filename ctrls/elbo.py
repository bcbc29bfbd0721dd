"""The evidence lower bound of Theorem 5.3 (Eq. 8), on cached backbone features.

    ELBO = sum_t E_Q[ log P_omega(x_t | x_<t, z_<=t) ] - sum_t KL( Q_phi(z_t | x_<=t) || P_theta(z_t | z_{t-1}) )

Reconstruction: the log-likelihood of step t's tokens under the adapted model with the step's
posterior state s_t (z_t = s_t Gamma; the expectation over Q is taken at its mean, as in the
paper's soft assignment). With last-hidden injection the frozen backbone's last hidden states are
cached once, and the term is log_softmax(lm_head(adapter(H, z_t)))[target]. Position rule
(DESIGN.md): if step t's tokens sit at positions a .. b-1, the hidden states at positions
a-1 .. b-2 predict them and carry z_t.

KL: KL(s_t || s_{t-1} softmax(L)) (``ctrls.policy.kl_to_prior``), with s_0 = Q_phi(x_0) from the
prompt. It has no adapter parameters: L is fitted beforehand by the transition fit (pretraining
stage (e), ``ctrls.policy.fit_transitions``) and the term is reported here.

Memory: the LM head's logits (n x V, V up to 152k) are computed ``chunk`` positions at a time in
float32, and never kept for the backward pass: the head is frozen, so the gradient of
log p(target) with respect to the adapted hidden state, (onehot - softmax) W, is computed in the
forward pass and only that (n x d) tensor is stored. Peak memory is O(chunk V + P d), not O(P V).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ctrls.adapter import StateAdapter
from ctrls.policy import kl_to_prior


@dataclass
class ElboTerms:
    """Both terms of Eq. 8 for a batch of S steps with P target tokens in all."""

    token_logprob: torch.Tensor  # (P,) log P_omega of each target token
    rec_per_step: torch.Tensor  # (S,) sum over the step's tokens
    kl_per_step: torch.Tensor  # (S,)
    n_tokens: torch.Tensor  # (S,) tokens per step (float)

    @property
    def elbo(self) -> torch.Tensor:
        """sum_t rec_t - sum_t KL_t (Eq. 8) for the batch."""
        return self.rec_per_step.sum() - self.kl_per_step.sum()

    @property
    def rec_per_token_mean(self) -> float:
        return float(self.token_logprob.detach().mean())

    @property
    def kl_per_step_mean(self) -> float:
        return float(self.kl_per_step.detach().mean())


class _FrozenHeadLogprob(torch.autograd.Function):
    """log_softmax(h W^T + b)[y] for a frozen linear head, differentiable in h only.

    d log p_y / d h = (onehot(y) - softmax) W is computed in the forward pass, so the backward pass
    needs neither the (n, V) logits nor a second head matmul."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
        logp = F.linear(h.to(weight.dtype), weight, bias).float().log_softmax(-1)
        out = logp.gather(-1, y[:, None]).squeeze(-1)
        if ctx.needs_input_grad[0]:
            g = logp.exp_().neg_()  # -softmax, in place
            g[torch.arange(len(y), device=y.device), y] += 1.0
            ctx.save_for_backward((g.to(weight.dtype) @ weight).to(h.dtype))
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (dlogp_dh,) = ctx.saved_tensors
        return grad_out[:, None].to(dlogp_dh.dtype) * dlogp_dh, None, None, None


def _check_inputs(adapter: StateAdapter, lm_head: torch.nn.Module, centroids: torch.Tensor, hidden: torch.Tensor,
                  targets: torch.Tensor, step_index: torch.Tensor, s_post: torch.Tensor, s_prev: torch.Tensor,
                  L: torch.Tensor, chunk: int) -> None:
    if not isinstance(lm_head, torch.nn.Linear):
        raise TypeError(f"lm_head must be a torch.nn.Linear, got {type(lm_head).__name__}")
    if lm_head.weight.requires_grad:
        raise ValueError("lm_head must be frozen (requires_grad=False): the ELBO trains the adapter only")
    P = hidden.shape[0]
    if hidden.dim() != 2 or hidden.shape[1] != adapter.hidden_size:
        raise ValueError(f"hidden must be (P, {adapter.hidden_size}), got {tuple(hidden.shape)}")
    for name, t in (("targets", targets), ("step_index", step_index)):
        if t.shape != (P,) or t.dtype != torch.long:
            raise ValueError(f"{name} must be a LongTensor of shape ({P},), got {t.dtype} {tuple(t.shape)}")
    if s_post.dim() != 2 or s_prev.shape != s_post.shape:
        raise ValueError(f"s_post and s_prev must both be (S, K), got {tuple(s_post.shape)} and {tuple(s_prev.shape)}")
    S, K = s_post.shape
    if centroids.shape[0] != K or L.shape != (K, K):
        raise ValueError(f"centroids {tuple(centroids.shape)} and L {tuple(L.shape)} must have K = {K} states")
    if P and (int(step_index.min()) < 0 or int(step_index.max()) >= S):
        raise ValueError(f"step_index must lie in [0, {S}), got values in "
                         f"[{int(step_index.min())}, {int(step_index.max())}]")
    if P and (int(targets.min()) < 0 or int(targets.max()) >= lm_head.out_features):
        raise ValueError(f"targets must lie in [0, {lm_head.out_features}) (the vocabulary), "
                         f"got values in [{int(targets.min())}, {int(targets.max())}]")
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")


def elbo_terms(adapter: StateAdapter, lm_head: torch.nn.Module, centroids: torch.Tensor, hidden: torch.Tensor,
               targets: torch.Tensor, step_index: torch.Tensor, s_post: torch.Tensor, s_prev: torch.Tensor,
               L: torch.Tensor, chunk: int = 1024) -> ElboTerms:
    """Both terms of Eq. 8 for a batch of steps (last-hidden injection, cached features).

    hidden (P, d): the frozen backbone's last hidden states at the predictor positions of every
    step (position rule in the module docstring), concatenated; targets (P,): the token each
    position predicts; step_index (P,): the step row (0 .. S-1) each position belongs to;
    s_post (S, K): each step's posterior state s_t; s_prev (S, K): the previous step's (s_0, the
    prompt's encoding, for a first step); centroids (K, D); L (K, K) the transition logits.
    The log-softmax runs in float32, ``chunk`` positions at a time.
    """
    _check_inputs(adapter, lm_head, centroids, hidden, targets, step_index, s_post, s_prev, L, chunk)
    code = adapter.mixture_code(s_post, centroids)  # (S, r): W_z z_t for every step
    logps = []
    for a in range(0, hidden.shape[0], chunk):
        h = adapter.fuse(hidden[a:a + chunk], code[step_index[a:a + chunk]])
        logps.append(_FrozenHeadLogprob.apply(h, lm_head.weight, lm_head.bias, targets[a:a + chunk]))
    token_logprob = torch.cat(logps) if logps else hidden.new_zeros(0, dtype=torch.float32)
    S = s_post.shape[0]
    rec = token_logprob.new_zeros(S).index_add(0, step_index, token_logprob)
    n = token_logprob.new_zeros(S).index_add(0, step_index, torch.ones_like(token_logprob))
    return ElboTerms(token_logprob, rec, kl_to_prior(s_post, s_prev, L), n)


def elbo_loss(terms: ElboTerms) -> torch.Tensor:
    """The negative ELBO per token: -(sum_t rec_t - sum_t KL_t) / (number of target tokens).

    Both terms are divided by the same token count, so the loss is -ELBO up to a constant factor
    and its minimiser is the ELBO's maximiser. Its gradient reaches the adapter through the
    reconstruction term only (the KL has no adapter parameters; L is fitted by the transition fit).
    """
    tokens = terms.n_tokens.sum().clamp(min=1)
    return -terms.elbo / tokens
