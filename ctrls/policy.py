"""P_theta and pi_theta: the transition model and the Dirichlet policy (Sec. 5.3, 5.4; Eq. 13-14).

One K x K logit matrix L serves both (DESIGN.md). The transition prior given a state distribution
s is p = s softmax(L) (rows of softmax(L) are P_theta(. | state j)). The policy draws the next state
distribution a ~ Dir(c p) with a learned concentration c; the epsilon-greedy policy pi~ draws from
Dir(1, ..., 1), the uniform distribution on the simplex, with probability epsilon, and its exact
log-density is log[(1 - eps) Dir(a; c p) + eps Gamma(K)]. The entropy bonus H (Eq. 13) is the
entropy of the categorical p; the Dirichlet's differential entropy is an option.

Offline, L is fitted by minimising sum_t KL(s_t || s_{t-1} softmax(L)), the ELBO's KL term.
"""
from __future__ import annotations

import math

import torch

CONC_FLOOR = 1e-3  # Dirichlet parameters c * p are clamped to at least this
SIMPLEX_FLOOR = 1e-6  # actions are clamped to at least this (and renormalised) before log-densities


class TransitionPolicy(torch.nn.Module):
    def __init__(self, n_states: int, concentration: float = 20.0):
        super().__init__()
        self.L = torch.nn.Parameter(torch.zeros(n_states, n_states))
        self.log_c = torch.nn.Parameter(torch.tensor(math.log(concentration)))

    @property
    def n_states(self) -> int:
        return self.L.shape[0]

    def transition(self) -> torch.Tensor:
        """softmax(L): row i is P_theta(. | state i)."""
        return torch.softmax(self.L, dim=-1)

    def prior(self, s: torch.Tensor) -> torch.Tensor:
        """p = s softmax(L), the transition prior P_theta(. | s)."""
        return s.to(self.L.dtype) @ self.transition()

    def concentration(self, s: torch.Tensor) -> torch.Tensor:
        return (self.log_c.exp() * self.prior(s)).clamp(min=CONC_FLOOR)

    def dirichlet(self, s: torch.Tensor) -> torch.distributions.Dirichlet:
        return torch.distributions.Dirichlet(self.concentration(s))

    @torch.no_grad()
    def sample(self, s: torch.Tensor, epsilon: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """a ~ pi~(. | s): Dir(c p) with probability 1 - epsilon, else Dir(1, ..., 1).

        torch's Dirichlet sampler takes no generator, so it runs under a forked RNG seeded from
        ``generator``: the same generator state gives the same draws."""
        conc = self.concentration(s.to(self.L.device))
        dev = conc.device
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device if generator else "cpu")) \
            if generator is not None else None
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else [], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            explore = torch.rand(conc.shape[:-1], device=dev) < epsilon
            conc = torch.where(explore[..., None], torch.ones_like(conc), conc)
            return torch.distributions.Dirichlet(conc).sample()

    def log_prob(self, a: torch.Tensor, s: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
        """log pi~(a | s), exactly: the log of the (1 - eps, eps) mixture of Dir(c p) and Dir(1)."""
        a = a.to(self.L.dtype).clamp(min=SIMPLEX_FLOOR)
        a = a / a.sum(-1, keepdim=True)
        lp = self.dirichlet(s).log_prob(a)
        if epsilon <= 0:
            return lp
        uniform = torch.full_like(lp, math.lgamma(self.n_states))  # Dir(a; 1) = (K-1)! on the simplex
        if epsilon >= 1:
            return uniform
        return torch.logaddexp(lp + math.log1p(-epsilon), uniform + math.log(epsilon))

    def entropy(self, s: torch.Tensor, kind: str = "categorical") -> torch.Tensor:
        """H(pi_theta(s)): the categorical entropy of p (Eq. 13), or the Dirichlet's differential entropy."""
        if kind == "categorical":
            p = self.prior(s).clamp(min=1e-12)
            return -(p * p.log()).sum(-1)
        if kind == "dirichlet":
            return self.dirichlet(s).entropy()
        raise ValueError(f"unknown entropy kind {kind!r}: categorical or dirichlet")


def kl_to_prior(s_post: torch.Tensor, s_prev: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """KL(s_t || s_{t-1} softmax(L)) per row (the ELBO's KL term, Thm 5.3)."""
    prior = (s_prev.to(L.dtype) @ torch.softmax(L, -1)).clamp(min=1e-12)
    post = s_post.to(L.dtype).clamp(min=1e-12)
    return (post * (post.log() - prior.log())).sum(-1)


def soft_counts_init(s_prev: torch.Tensor, s_next: torch.Tensor, smoothing: float = 0.1) -> torch.Tensor:
    """L0 = log of the row-normalised soft transition counts s_prev^T s_next (+ smoothing)."""
    counts = s_prev.double().T @ s_next.double() + smoothing
    return (counts / counts.sum(-1, keepdim=True)).log().float()


def fit_transitions(s_prev: torch.Tensor, s_next: torch.Tensor, n_states: int, steps: int = 300, lr: float = 0.05,
                    smoothing: float = 0.1) -> tuple[torch.Tensor, list[float]]:
    """Fit L by minimising the mean KL(s_next || s_prev softmax(L)): soft-count start, then Adam.
    Returns L and the KL after the start and after every step."""
    if s_prev.shape != s_next.shape or s_prev.shape[-1] != n_states:
        raise ValueError(f"transition pairs must both be (M, {n_states}), got {tuple(s_prev.shape)} and {tuple(s_next.shape)}")
    L = torch.nn.Parameter(soft_counts_init(s_prev, s_next, smoothing))
    opt = torch.optim.Adam([L], lr=lr)
    history = []
    for _ in range(steps):
        loss = kl_to_prior(s_next, s_prev, L).mean()
        history.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        history.append(float(kl_to_prior(s_next, s_prev, L).mean()))
    return L.detach(), history
