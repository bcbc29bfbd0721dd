"""The evidence lower bound of Theorem 5.3 (Eq. 8), on cached backbone features.

    ELBO = sum_t E_Q[ log P_omega(x_t | x_<t, z_<=t) ] - sum_t KL( Q_phi(z_t | x_<=t) || P_theta(z_t | z_{t-1}) )

Reconstruction: each step's token log-likelihood under the adapted model given that step's
posterior state s_t (z_t = s_t Gamma). With last-hidden injection the frozen backbone's last hidden
states are cached once, so the term is lm_head(adapter(H, z_t)) gathered at the targets. Position
rule (DESIGN.md): the hidden states at positions a-1 .. b-2 predict step t's tokens a .. b-1 and
carry z_t. KL: KL(s_t || s_{t-1} softmax(L)), with s_0 = Q_phi(x_0) from the question.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ctrls.adapter import StateAdapter
from ctrls.policy import kl_to_prior


@dataclass
class ElboTerms:
    token_logprob: torch.Tensor  # (P,) log P_omega of each target token
    rec_per_step: torch.Tensor  # (S,) sum over the step's tokens
    kl_per_step: torch.Tensor  # (S,)
    n_tokens: torch.Tensor  # (S,)

    @property
    def elbo(self) -> torch.Tensor:
        return self.rec_per_step.sum() - self.kl_per_step.sum()

    @property
    def rec_per_token_mean(self) -> float:
        return float(self.token_logprob.mean())

    @property
    def kl_per_step_mean(self) -> float:
        return float(self.kl_per_step.mean())


def elbo_terms(adapter: StateAdapter, lm_head: torch.nn.Module, centroids: torch.Tensor, hidden: torch.Tensor,
               targets: torch.Tensor, step_index: torch.Tensor, s_post: torch.Tensor, s_prev: torch.Tensor,
               L: torch.Tensor, chunk: int = 1024) -> ElboTerms:
    """Both ELBO terms for a batch of steps.

    hidden (P, d): cached last hidden states at the predictor positions; targets (P,): the tokens
    they predict; step_index (P,): the step row (0..S-1) of each position; s_post (S, K): the
    posterior state of each step; s_prev (S, K): the previous step's (s_0 for a first step).
    The log-softmax runs in float32, ``chunk`` positions at a time.
    """
    S = s_post.shape[0]
    logps = []
    for a in range(0, hidden.shape[0], chunk):
        h = adapter.forward_s(hidden[a:a + chunk], s_post[step_index[a:a + chunk]], centroids)
        logits = lm_head(h.to(lm_head.weight.dtype)).float()
        logps.append(torch.log_softmax(logits, -1).gather(-1, targets[a:a + chunk, None]).squeeze(-1))
    token_logprob = torch.cat(logps)
    rec = torch.zeros(S, dtype=token_logprob.dtype, device=token_logprob.device).index_add(0, step_index, token_logprob)
    n = torch.zeros(S, device=token_logprob.device).index_add(0, step_index, torch.ones_like(token_logprob))
    kl = kl_to_prior(s_post, s_prev, L)
    return ElboTerms(token_logprob, rec, kl, n)


def elbo_loss(terms: ElboTerms) -> torch.Tensor:
    """The negative ELBO per token (KL over the same token count), minimised by the adapter.
    The KL term has no adapter parameters: L is fitted beforehand (pretrain stage e)."""
    tokens = terms.n_tokens.sum().clamp(min=1)
    return -(terms.rec_per_step.sum() - terms.kl_per_step.sum()) / tokens
