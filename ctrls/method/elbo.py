"""Thm. 5.3's evidence lower bound, and the relaxed objective the adapter is trained on.

With z discrete (z_t in the K centroids, z_0 ~ s_0, transitions softmax(L), Q(z_t = gamma_j) = s_tj):

    log P(x_{1:T} | x_0) >= ELBO = sum_t sum_j s_tj log P_omega(x_t | x_<t, z_t = gamma_j)      (reconstruction)
                                  - sum_t sum_i s_{t-1,i} KL(s_t || softmax(L)_i)               (expected KL)

with P_omega the backbone and the adapter (Eq. 8). ``elbo`` computes it in nats, exactly over the K
centroids (``samples=0``) or by Monte Carlo with its standard error (``samples=n``); ``relaxed_terms`` /
``relaxed_loss`` (the mean state, Sec. 5.2, minus the mixture-prior KL) train the adapter: not a bound.
Positions a-1 .. b-2 carry z_t for step t's tokens a .. b-1; the LM head runs ``chunk`` positions at a
time (``_FrozenHeadLogprob``). Derivation: book/method.md, "The evidence lower bound (Thm. 5.3)".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ctrls.method.adapter import StateAdapter
from ctrls.method.policy import (  # expected_kl: Thm. 5.3's KL term (re-exported here)
    expected_kl,
    kl_to_prior,
)

# ---- Thm. 5.3: the bound ------------------------------------------------------------------------


@dataclass
class Elbo:
    """Thm. 5.3's bound for S steps, term by term (nats; float64).

    ``rec_per_step[t]`` = E_{z_t ~ Q}[log P_omega(x_t | x_<t, z_t)] (exact, or the Monte Carlo
    estimate, whose variance is ``rec_var_per_step[t]``; zeros when exact);
    ``kl_per_step[t]`` = sum_i s_{t-1,i} KL(s_t || softmax(L)_i); ``n_tokens[t]``: tokens of step t.
    ``relaxed_rec_per_step[t]``, for comparison only, is log P_omega(x_t | x_<t, z_t = sum_j s_tj gamma_j),
    the relaxed objective's reconstruction at the mean state (None where not computed)."""

    rec_per_step: torch.Tensor
    kl_per_step: torch.Tensor
    n_tokens: torch.Tensor
    rec_var_per_step: torch.Tensor
    relaxed_rec_per_step: torch.Tensor | None = None

    @property
    def value(self) -> torch.Tensor:
        """sum_t rec_t - sum_t KL_t (Thm. 5.3)."""
        return self.rec_per_step.sum() - self.kl_per_step.sum()

    @property
    def stderr(self) -> float:
        """Standard error of ``value`` (0 when the reconstruction is exact; steps are sampled independently)."""
        return float(self.rec_var_per_step.sum().sqrt())


def elbo_from_logliks(loglik: torch.Tensor, s_post: torch.Tensor, s_prev: torch.Tensor, L: torch.Tensor,
                      n_tokens: torch.Tensor | None = None) -> Elbo:
    """Thm. 5.3's bound from the step log-likelihoods under each state.

    loglik (S, K): log P_omega(x_t | x_<t, z_t = gamma_j); s_post, s_prev (S, K); L (K, K).
    rec_t = sum_j s_tj loglik_tj (a state with s_tj = 0 contributes 0, even where loglik is -inf)."""
    if loglik.shape != s_post.shape or s_prev.shape != s_post.shape:
        raise ValueError(f"loglik, s_post and s_prev must all be (S, K), got {tuple(loglik.shape)}, "
                         f"{tuple(s_post.shape)} and {tuple(s_prev.shape)}")
    post = s_post.double()
    rec = torch.where(post > 0, post * loglik.double(), post.new_zeros(())).sum(-1)  # Thm. 5.3, E_{z_t~Q}[log P]
    n = n_tokens.double() if n_tokens is not None else post.new_full((len(post),), float("nan"))
    return Elbo(rec, expected_kl(s_post, s_prev, L), n, torch.zeros_like(rec))


def state_token_logprobs(adapter: StateAdapter, lm_head: torch.nn.Module, centroids: torch.Tensor,
                         hidden: torch.Tensor, targets: torch.Tensor, step_index: torch.Tensor,
                         s_post: torch.Tensor | None = None, chunk: int = 1024
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log P_omega(y_p | z = gamma_j) for every position p and every state j, (P, K) float64, exactly,
    at the cost of about one LM-head pass (not K); with ``s_post`` also (P,) at the mean state
    z = sum_j s_{t(p),j} gamma_j (else None).

    Why one pass suffices: the adapter's fusion (Eq. 8) is E' = E + F_u(GELU([F_d(E); W_z z])) with
    F_u(h) = U h + b_u and an elementwise GELU, so U splits into its two column blocks U_a, U_c and
        E' = A(E) + u(z),   A(E) = E + U_a GELU(F_d E) + b_u,   u(z) = U_c GELU(W_z z):
    the state shifts the hidden state by a vector that does not depend on the token. The logits
    under state j are then base + delta_j, with base = W A(E) + b_head and delta_j = W u(gamma_j), and
    logsumexp_v(base_v + delta_jv) for all j at once is log(exp(base - m) @ exp(delta - M)^T) + m + M,
    a (P, V) x (V, K) product, in float64 (a sum underflows only if base + delta_j spans ~700 nats). The
    mean states z_t = s_t Gamma of
    the steps in a chunk ride along as more columns of the same product. Exact up to rounding;
    tests/method/test_elbo.py checks it against K full adapted forward passes."""
    if not isinstance(adapter, StateAdapter):
        raise TypeError(f"the exact reconstruction relies on StateAdapter's fusion, got {type(adapter).__name__}; "
                        f"use the Monte Carlo estimate (samples > 0)")
    if not adapter.separable:  # the mlp fusion: one adapted pass per state (K passes), still exact
        return _state_logprobs_by_passes(adapter, lm_head, centroids, hidden, targets, step_index, s_post, chunk)
    W, b = lm_head.weight, lm_head.bias
    r = adapter.rank
    U_a, U_c = adapter.up.weight[:, :r], adapter.up.weight[:, r:]
    with torch.no_grad():
        proj = adapter.state(centroids.to(adapter.state.weight.dtype))  # (K, r): W_z gamma_j
        u = F.gelu(proj) @ U_c.T  # (K, d): u(gamma_j)
        delta = F.linear(u.to(W.dtype), W).double()  # (K, V)
        M = delta.max(-1, keepdim=True).values
        e_delta = (delta - M).exp()  # (K, V)
        if s_post is not None:
            u_bar = F.gelu(s_post.to(proj.dtype) @ proj) @ U_c.T  # (S, d): u(mean z_t)
        K = centroids.shape[0]
        out, out_bar = [], []
        for a in range(0, hidden.shape[0], chunk):
            x = hidden[a:a + chunk].to(adapter.down.weight.dtype)
            A = (x + F.gelu(adapter.down(x)) @ U_a.T + adapter.up.bias).to(hidden.dtype)  # A(E), Eq. 8
            base = F.linear(A.to(W.dtype), W, b).double()  # (c, V)
            y = targets[a:a + chunk]
            base_y = base.gather(-1, y[:, None])  # (c, 1)
            m = base.max(-1, keepdim=True).values
            e_base = base.sub_(m).exp_()  # in place: exp(base - m)
            cols = e_delta
            if s_post is not None:  # the mean states of the chunk's steps, as K more columns
                steps, inv = step_index[a:a + chunk].unique(return_inverse=True)
                d_bar = F.linear(u_bar[steps].to(W.dtype), W).double()  # (n_steps, V)
                M_bar = d_bar.max(-1, keepdim=True).values
                cols = torch.cat([e_delta, (d_bar - M_bar).exp()])
            sums = e_base @ cols.T  # (c, K [+ n_steps]): sum_v exp(base - m) exp(delta - M)
            lse = sums[:, :K].log() + m + M.T  # (c, K): logsumexp_v(base_v + delta_jv)
            out.append(base_y + delta[:, y].T - lse)  # Eq. 8 + softmax, under every state
            if s_post is not None:
                lse_bar = sums[:, K:].gather(-1, inv[:, None]).log() + m + M_bar[inv]
                out_bar.append((base_y + d_bar[inv, y][:, None] - lse_bar)[:, 0])
    lp = torch.cat(out) if out else hidden.new_zeros(0, K, dtype=torch.float64)
    lp_bar = None if s_post is None else (torch.cat(out_bar) if out_bar else hidden.new_zeros(0, dtype=torch.float64))
    return lp, lp_bar


def _state_logprobs_by_passes(adapter: StateAdapter, lm_head: torch.nn.Module, centroids: torch.Tensor,
                              hidden: torch.Tensor, targets: torch.Tensor, step_index: torch.Tensor,
                              s_post: torch.Tensor | None, chunk: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``state_token_logprobs`` for any fusion: one adapted forward per state (K LM-head passes)."""
    K = centroids.shape[0]
    with torch.no_grad():
        proj = adapter.state(centroids.to(adapter.state.weight.dtype))  # (K, r)
        cols = [_token_logprob(adapter, lm_head, hidden, proj[j].expand(hidden.shape[0], -1), targets, chunk)
                for j in range(K)]
        lp = torch.stack(cols, -1) if cols else hidden.new_zeros(0, K, dtype=torch.float64)
        lp_bar = None
        if s_post is not None:
            code = (s_post.to(proj.dtype) @ proj)[step_index]
            lp_bar = _token_logprob(adapter, lm_head, hidden, code, targets, chunk)
    return lp, lp_bar


def _token_logprob(adapter: StateAdapter, lm_head: torch.nn.Module, hidden: torch.Tensor, code: torch.Tensor,
                   targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """log P_omega(y_p | state code_p) (P,) float64 by a plain forward (any adapter with ``fuse``), no gradient."""
    out = []
    with torch.no_grad():
        for a in range(0, hidden.shape[0], chunk):
            h = adapter.fuse(hidden[a:a + chunk], code[a:a + chunk])
            logp = F.linear(h.to(lm_head.weight.dtype), lm_head.weight, lm_head.bias).double().log_softmax(-1)
            out.append(logp.gather(-1, targets[a:a + chunk, None])[:, 0])
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float64)


def elbo(adapter: StateAdapter, lm_head: torch.nn.Module, centroids: torch.Tensor, hidden: torch.Tensor,
         targets: torch.Tensor, step_index: torch.Tensor, s_post: torch.Tensor, s_prev: torch.Tensor,
         L: torch.Tensor, samples: int = 0, generator: torch.Generator | None = None, chunk: int = 1024) -> Elbo:
    """Thm. 5.3's bound for a batch of S steps, with z_t discrete, Q(z_t = gamma_j) = s_tj.

    Inputs as for ``relaxed_terms`` (every token of a step should be included: a truncated step
    drops factors log P <= 0 and the sum is then no longer a bound). ``samples=0``: the
    reconstruction exactly over the K centroids (``state_token_logprobs``). ``samples=n >= 2``:
    Monte Carlo, n draws z_t ~ Cat(s_t) per step (``generator`` seeds them), one plain forward per
    draw; ``rec_var_per_step`` is then the variance of each step's mean (sample variance / n).
    No gradient flows; call it with the adapter in eval mode."""
    _check_inputs(adapter, lm_head, centroids, hidden, targets, step_index, s_post, s_prev, L, chunk)
    if samples != 0 and samples < 2:
        raise ValueError(f"samples must be 0 (exact) or at least 2 (Monte Carlo with a standard error), got {samples}")
    S, K = s_post.shape
    n = hidden.new_zeros(S, dtype=torch.float64).index_add(0, step_index, hidden.new_ones(len(step_index),
                                                                                            dtype=torch.float64))
    if samples == 0:
        lp, lp_bar = state_token_logprobs(adapter, lm_head, centroids, hidden, targets, step_index, s_post, chunk)
        loglik = lp.new_zeros(S, K).index_add(0, step_index, lp)  # (S, K): log P(x_t | x_<t, gamma_j)
        out = elbo_from_logliks(loglik, s_post, s_prev, L, n)
        out.relaxed_rec_per_step = lp.new_zeros(S).index_add(0, step_index, lp_bar)
        return out
    with torch.no_grad():
        proj = adapter.state(centroids.to(adapter.state.weight.dtype))  # (K, r)
        draws = torch.multinomial(s_post.detach().double().cpu(), samples, replacement=True,
                                  generator=generator).to(hidden.device)  # (S, n): z_t ~ Q
        per_draw = torch.stack([hidden.new_zeros(S, dtype=torch.float64).index_add(
            0, step_index, _token_logprob(adapter, lm_head, hidden, proj[draws[step_index, i]], targets, chunk))
            for i in range(samples)], 1)  # (S, n): log P(x_t | x_<t, z_t = draw i)
        bar = _token_logprob(adapter, lm_head, hidden, adapter.mixture_code(s_post, centroids)[step_index], targets,
                             chunk)
    rec = per_draw.mean(1)  # Thm. 5.3, Monte Carlo estimate of E_{z_t~Q}[log P]
    var = per_draw.var(1) / samples
    return Elbo(rec, expected_kl(s_post, s_prev, L), n, var, per_draw.new_zeros(S).index_add(0, step_index, bar))


# ---- the relaxed objective (training) -----------------------------------------------------------


@dataclass
class RelaxedTerms:
    """The relaxed objective's two terms for a batch of S steps with P target tokens in all (not a bound)."""

    token_logprob: torch.Tensor  # (P,) log P_omega of each target token at the mean state
    rec_per_step: torch.Tensor  # (S,) sum over the step's tokens
    kl_per_step: torch.Tensor  # (S,) KL(s_t || s_{t-1} softmax(L)), the mixture-prior KL
    n_tokens: torch.Tensor  # (S,) tokens per step (float)

    @property
    def objective(self) -> torch.Tensor:
        """sum_t rec_t - sum_t KL_t, at the mean state and with the mixture-prior KL."""
        return self.rec_per_step.sum() - self.kl_per_step.sum()

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
        raise ValueError("lm_head must be frozen (requires_grad=False): only the adapter is trained")
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


def relaxed_terms(adapter: StateAdapter, lm_head: torch.nn.Module, centroids: torch.Tensor, hidden: torch.Tensor,
                  targets: torch.Tensor, step_index: torch.Tensor, s_post: torch.Tensor, s_prev: torch.Tensor,
                  L: torch.Tensor, chunk: int = 1024) -> RelaxedTerms:
    """The relaxed objective's terms for a batch of steps (last-hidden injection, cached features).

    hidden (P, d): the frozen backbone's last hidden states at the predictor positions of every
    step (position rule in the module docstring), concatenated; targets (P,): the token each
    position predicts; step_index (P,): the step row (0 .. S-1) each position belongs to;
    s_post (S, K): each step's posterior state s_t; s_prev (S, K): the previous step's (s_0, the
    prompt's encoding, for a first step); centroids (K, D); L (K, K) the transition logits.
    The reconstruction is taken at the mean state z_t = s_t Gamma; the log-softmax runs in
    float32, ``chunk`` positions at a time. Differentiable in the adapter's parameters.
    """
    _check_inputs(adapter, lm_head, centroids, hidden, targets, step_index, s_post, s_prev, L, chunk)
    code = adapter.mixture_code(s_post, centroids)  # (S, r): W_z z_t for every step, z_t = s_t Gamma
    logps = []
    for a in range(0, hidden.shape[0], chunk):
        h = adapter.fuse(hidden[a:a + chunk], code[step_index[a:a + chunk]])  # Eq. 8
        logps.append(_FrozenHeadLogprob.apply(h, lm_head.weight, lm_head.bias, targets[a:a + chunk]))
    token_logprob = torch.cat(logps) if logps else hidden.new_zeros(0, dtype=torch.float32)
    S = s_post.shape[0]
    rec = token_logprob.new_zeros(S).index_add(0, step_index, token_logprob)
    n = token_logprob.new_zeros(S).index_add(0, step_index, torch.ones_like(token_logprob))
    return RelaxedTerms(token_logprob, rec, kl_to_prior(s_post, s_prev, L), n)


def relaxed_loss(terms: RelaxedTerms) -> torch.Tensor:
    """The adapter's training loss: minus the relaxed objective per token,
    -(sum_t rec_t - sum_t KL_t) / (number of target tokens).

    Both terms are divided by the same token count, so the minimiser is the relaxed objective's
    maximiser. Its gradient reaches the adapter through the reconstruction term only (the KL has
    no adapter parameters; L is fitted by the transition fit)."""
    tokens = terms.n_tokens.sum().clamp(min=1)
    return -terms.objective / tokens
