"""P_theta and pi_theta: the transition model and the Dirichlet policy (Sec. 5.3, 5.4; Eq. 13-14).

One K x K logit matrix L serves both (DESIGN.md, "Transition model and policy"):
- transition prior: row j of softmax(L) is P_theta(. | state j); for a state distribution s the
  prior is p = s softmax(L).
- policy: the next state distribution is a ~ Dir(c p), with mean p and a learned concentration
  c = exp(log_c). The epsilon-greedy policy pi~ draws from Dir(1, ..., 1), the uniform
  distribution on the simplex, with probability epsilon; its log-density is exactly
  log[(1 - eps) Dir(a; c p) + eps Dir(a; 1)], with Dir(a; 1) = Gamma(K) = (K-1)!.
- entropy bonus H (Eq. 13): the entropy of the categorical p (the paper's discrete sum); the
  Dirichlet's differential entropy is an option.
Offline (pretraining), L is fitted by minimising sum_t KL(s_t || s_{t-1} softmax(L)), the ELBO's
KL term (Thm 5.3): ``fit_transitions``. RL then fine-tunes L and log_c only.

Numerical floors (documented, deliberate):
- ``CONC_FLOOR``: Dirichlet parameters c p are clamped to at least 1e-3, so that a vanishing p_j
  or c never gives an invalid (zero) concentration.
- ``SIMPLEX_FLOOR``: before a log-density, a is clamped to at least 1e-6 and renormalised; a
  sampled a_j can underflow to 0 when c p_j is small, where log a_j would be -inf.

Sampling is seeded by a ``torch.Generator``: torch's Gamma/Dirichlet samplers accept none, so
``sample_dirichlet`` draws Gamma variates with the Marsaglia-Tsang method from ``torch.randn`` /
``torch.rand`` with the generator (same generator state, same draws, on any device), and
normalises them in log space (softmax), which stays exact for tiny concentrations.
"""
from __future__ import annotations

import math

import torch

CONC_FLOOR = 1e-3  # Dirichlet parameters c * p are clamped to at least this
SIMPLEX_FLOOR = 1e-6  # actions are clamped to at least this (and renormalised) before log-densities
PROB_FLOOR = 1e-12  # probabilities inside logs (entropy, KL)


def _log_standard_gamma(alpha: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """log of Gamma(alpha, 1) draws (Marsaglia & Tsang 2000), alpha > 0; alpha < 1 by the boost
    Gamma(alpha) = Gamma(alpha + 1) U^(1 / alpha), kept in log space."""
    dev = generator.device if generator is not None else alpha.device
    a = alpha.detach().double().to(dev)
    small = a < 1
    a1 = torch.where(small, a + 1, a)
    d = a1 - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    out = torch.empty_like(a)
    pending = torch.ones_like(a, dtype=torch.bool)
    while pending.any():  # each draw is accepted with probability > 0.95
        x = torch.randn(a.shape, generator=generator, device=dev, dtype=a.dtype)
        u = torch.rand(a.shape, generator=generator, device=dev, dtype=a.dtype)
        v = (1 + c * x) ** 3
        log_v = torch.log(v.clamp(min=1e-300))
        ok = pending & (v > 0) & (torch.log(u) < 0.5 * x * x + d - d * v + d * log_v)
        out = torch.where(ok, torch.log(d) + log_v, out)
        pending &= ~ok
    u = torch.rand(a.shape, generator=generator, device=dev, dtype=a.dtype)
    return torch.where(small, out + torch.log(u) / a, out).to(alpha.device)


def sample_dirichlet(alpha: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """a ~ Dir(alpha) for each row of alpha (..., K), seeded by ``generator`` (default: the global RNG)."""
    return torch.softmax(_log_standard_gamma(alpha, generator), dim=-1).to(alpha.dtype)


class TransitionPolicy(torch.nn.Module):
    """L (K x K logits) and log_c: the transition prior P_theta and the epsilon-greedy Dirichlet policy pi~."""

    def __init__(self, n_states: int, concentration: float = 20.0):
        super().__init__()
        if n_states < 1 or concentration <= 0:
            raise ValueError(f"need n_states >= 1 and concentration > 0, got {n_states} and {concentration}")
        self.L = torch.nn.Parameter(torch.zeros(n_states, n_states))
        self.log_c = torch.nn.Parameter(torch.tensor(math.log(concentration)))

    @property
    def n_states(self) -> int:
        return self.L.shape[0]

    def transition(self) -> torch.Tensor:
        """softmax(L) (K, K): row j is P_theta(. | state j)."""
        return torch.softmax(self.L, dim=-1)

    def prior(self, s: torch.Tensor) -> torch.Tensor:
        """p (..., K) = s softmax(L), the transition prior P_theta(. | s)."""
        if s.shape[-1] != self.n_states:
            raise ValueError(f"state distributions have {s.shape[-1]} entries, the policy {self.n_states} states")
        return s.to(self.L.dtype) @ self.transition()

    def concentration(self, s: torch.Tensor) -> torch.Tensor:
        """c p (..., K), clamped to at least ``CONC_FLOOR``."""
        return (self.log_c.exp() * self.prior(s)).clamp(min=CONC_FLOOR)

    def dirichlet(self, s: torch.Tensor) -> torch.distributions.Dirichlet:
        """pi_theta(. | s) = Dir(c p) (without the epsilon-greedy mixture)."""
        return torch.distributions.Dirichlet(self.concentration(s))

    @torch.no_grad()
    def sample(self, s: torch.Tensor, epsilon: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """a (..., K) ~ pi~(. | s): Dir(c p) with probability 1 - epsilon, else Dir(1, ..., 1).
        The same ``generator`` state gives the same draws (see the module docstring)."""
        _check_epsilon(epsilon)
        conc = self.concentration(s.to(self.L.device))
        dev = generator.device if generator is not None else conc.device
        explore = (torch.rand(conc.shape[:-1], generator=generator, device=dev) < epsilon).to(conc.device)
        conc = torch.where(explore[..., None], torch.ones_like(conc), conc)
        return sample_dirichlet(conc, generator)

    def log_prob(self, a: torch.Tensor, s: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
        """log pi~(a | s) (...,): log[(1 - eps) Dir(a; c p) + eps Gamma(K)], by logaddexp.
        a is clamped to at least ``SIMPLEX_FLOOR`` and renormalised first."""
        _check_epsilon(epsilon)
        if a.shape[-1] != self.n_states:
            raise ValueError(f"actions have {a.shape[-1]} entries, the policy {self.n_states} states")
        a = a.to(self.L.dtype).clamp(min=SIMPLEX_FLOOR)
        a = a / a.sum(-1, keepdim=True)
        alpha = self.concentration(s)
        log_dir = (torch.lgamma(alpha.sum(-1)) - torch.lgamma(alpha).sum(-1)
                   + ((alpha - 1) * torch.log(a)).sum(-1))
        log_uniform = torch.full_like(log_dir, math.lgamma(self.n_states))
        if epsilon == 0:
            return log_dir
        if epsilon == 1:
            return log_uniform
        return torch.logaddexp(log_dir + math.log1p(-epsilon), log_uniform + math.log(epsilon))

    def entropy(self, s: torch.Tensor, kind: str = "categorical") -> torch.Tensor:
        """H(pi_theta(. | s)) (...,): the categorical entropy -sum_j p_j log p_j (Eq. 13), or
        (``kind="dirichlet"``) the differential entropy of Dir(c p)."""
        if kind == "categorical":
            p = self.prior(s)
            return -(p * p.clamp(min=PROB_FLOOR).log()).sum(-1)
        if kind == "dirichlet":
            return self.dirichlet(s).entropy()
        raise ValueError(f"unknown entropy kind {kind!r}: categorical or dirichlet")


def _check_epsilon(epsilon: float) -> None:
    if not 0 <= epsilon <= 1:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")


def kl_to_prior(s_post: torch.Tensor, s_prev: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """KL(s_t || s_{t-1} softmax(L)) (M,) per row: the ELBO's KL term (Thm 5.3).
    0 log 0 = 0; the prior is clamped to at least ``PROB_FLOOR`` inside the log."""
    prior = s_prev.to(L.dtype) @ torch.softmax(L, -1)
    post = s_post.to(L.dtype)
    return (torch.special.xlogy(post, post) - post * prior.clamp(min=PROB_FLOOR).log()).sum(-1)


def soft_counts_init(s_prev: torch.Tensor, s_next: torch.Tensor, smoothing: float = 0.1) -> torch.Tensor:
    """L0 (K, K) = log of the row-normalised soft transition counts s_prev^T s_next + smoothing."""
    counts = s_prev.double().T @ s_next.double() + smoothing
    return (counts / counts.sum(-1, keepdim=True)).log().float()


def fit_transitions(s_prev: torch.Tensor, s_next: torch.Tensor, n_states: int, steps: int = 300, lr: float = 0.05,
                    smoothing: float = 0.1) -> tuple[torch.Tensor, list[float]]:
    """Fit L (K, K) by minimising the mean over pairs of KL(s_next || s_prev softmax(L)).

    s_prev, s_next (M, K): state distributions of consecutive steps (s_0 of the prompt before the
    first step). Start from the soft counts (``soft_counts_init``), refine with ``steps`` Adam
    steps. Returns the L with the lowest mean KL seen (Adam's first steps can overshoot a start
    that is already near the optimum, as with one-hot states) and the mean KL at the start and
    after every step (``steps + 1`` values)."""
    if s_prev.shape != s_next.shape or s_prev.dim() != 2 or s_prev.shape[-1] != n_states:
        raise ValueError(f"transition pairs must both be (M, {n_states}), "
                         f"got {tuple(s_prev.shape)} and {tuple(s_next.shape)}")
    if len(s_prev) == 0:
        raise ValueError("no transition pairs to fit")
    for name, s in (("s_prev", s_prev), ("s_next", s_next)):
        bad = ~torch.isfinite(s).all(-1)
        if bad.any():
            raise ValueError(f"{name} row {int(bad.nonzero()[0])} is not finite")
    L = torch.nn.Parameter(soft_counts_init(s_prev, s_next, smoothing))
    opt = torch.optim.Adam([L], lr=lr)
    history: list[float] = []
    best = L.detach().clone()
    for step in range(steps + 1):
        loss = kl_to_prior(s_next, s_prev, L).mean()
        history.append(float(loss.detach()))
        if history[-1] <= min(history):
            best = L.detach().clone()
        if step == steps:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    return best, history
