"""P_theta and pi_theta: the transition model and the Dirichlet policy (Sec. 5.3, 5.4; Eq. 14 and Eq. 16).

One K x K logit matrix L serves both: the prior is p = s softmax(L), the policy draws a ~ Dir(c p),
c = exp(log_c), the epsilon-greedy pi~ mixes in Dir(1, ..., 1) (exact log-density), and the entropy bonus
(Eq. 14) is that of the categorical p. ``fit_transitions`` (Alg. 1) fits L to Thm. 5.3's expected KL
(closed form, ``soft_counts_init``; ``policy.fit: mixture``: the mixture-prior KL, ``kl_to_prior``).
Densities are evaluated from log-actions, never clamped actions, so that Eq. 16's score stays unbiased
(``sample_log`` returns log a exactly; ``log_prob_log`` reads it). ``CONC_FLOOR`` clamps c p to at least
1e-3 in sampler and density alike; non-finite input raises :class:`NonFiniteError`. Draws are seeded by a
``torch.Generator`` (Marsaglia-Tsang), or by per-row counter-based streams for the decoder
(``sample_policy_log_streams``). Reasons and measurements: book/method.md, "ctrls/method/policy.py".
"""
from __future__ import annotations

import math

import torch

from ctrls.method.streams import stream_subkeys, stream_uniform

CONC_FLOOR = 1e-3  # Dirichlet parameters c * p are clamped to at least this: never a zero concentration
PROB_FLOOR = 1e-12  # probabilities inside logs (entropy, KL)
MAX_REJECTION_ROUNDS = 200  # Marsaglia-Tsang accepts with probability > 0.95 per round


class NonFiniteError(ValueError):
    """A policy parameter, state or action is NaN or infinite."""


def check_finite(x: torch.Tensor, what: str) -> torch.Tensor:
    """Raise :class:`NonFiniteError` naming ``what`` (and the first bad entry) unless x is all finite."""
    bad = ~torch.isfinite(x.detach())
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise NonFiniteError(f"{what} has {int(bad.sum())} non-finite entries "
                             f"(first: {what}{list(idx)} = {float(x.detach()[idx])})")
    return x


def _mt_setup(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Marsaglia-Tsang constants for Gamma(a, 1): (a < 1, d, c), with a < 1 drawn as Gamma(a + 1) and
    boosted afterwards (``Gamma(a) = Gamma(a + 1) U^(1 / a)``)."""
    small = a < 1
    d = torch.where(small, a + 1, a) - 1.0 / 3.0
    return small, d, 1.0 / torch.sqrt(9.0 * d)


def _mt_accept(x: torch.Tensor, log_u: torch.Tensor, d: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One Marsaglia-Tsang round from a standard normal ``x`` and log-uniform ``log_u``: (accepted,
    log of the proposed Gamma draw d v)."""
    v = (1 + c * x) ** 3
    log_v = torch.log(v.clamp(min=1e-300))
    return (v > 0) & (log_u < 0.5 * x * x + d - d * v + d * log_v), torch.log(d) + log_v


def _log_standard_gamma(alpha: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """log of Gamma(alpha, 1) draws (Marsaglia & Tsang 2000), alpha > 0; alpha < 1 by the boost
    Gamma(alpha) = Gamma(alpha + 1) U^(1 / alpha), kept in log space. Raises on a non-finite or
    non-positive alpha and after ``MAX_REJECTION_ROUNDS`` rounds (never reached for valid alpha:
    each round rejects with probability < 0.05)."""
    dev = generator.device if generator is not None else alpha.device
    a = check_finite(alpha, "Dirichlet concentration").detach().double().to(dev)
    if bool((a <= 0).any()):
        raise ValueError(f"Dirichlet concentrations must be > 0, got min {float(a.min())}")
    small, d, c = _mt_setup(a)
    out = torch.empty_like(a)
    pending = torch.ones_like(a, dtype=torch.bool)
    for _ in range(MAX_REJECTION_ROUNDS):  # each draw is accepted with probability > 0.95
        if not pending.any():
            break
        x = torch.randn(a.shape, generator=generator, device=dev, dtype=a.dtype)
        u = torch.rand(a.shape, generator=generator, device=dev, dtype=a.dtype)
        ok, val = _mt_accept(x, torch.log(u), d, c)
        ok &= pending
        out = torch.where(ok, val, out)
        pending &= ~ok
    else:
        if pending.any():
            raise RuntimeError(f"Gamma sampler: {int(pending.sum())} draws still rejected after "
                               f"{MAX_REJECTION_ROUNDS} rounds (alpha in [{float(a.min())}, {float(a.max())}])")
    u = torch.rand(a.shape, generator=generator, device=dev, dtype=a.dtype)
    return torch.where(small, out + torch.log(u) / a, out).to(alpha.device)


def sample_dirichlet_log(alpha: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """log a (..., K) for a ~ Dir(alpha), each row of alpha (..., K), seeded by ``generator``
    (default: the global RNG): log-Gammas minus their logsumexp, in float64, exact even where
    a_j underflows to 0 in any float format."""
    g = _log_standard_gamma(alpha, generator)
    return g - torch.logsumexp(g, dim=-1, keepdim=True)


def sample_dirichlet(alpha: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """a ~ Dir(alpha) for each row of alpha (..., K) (the same draws as ``sample_dirichlet_log``, exponentiated)."""
    return sample_dirichlet_log(alpha, generator).exp().to(alpha.dtype)


# ---- counter-based draws (vectorised over rows) -------------------------------------------------
#
# Stream layout of one draw (``sample_log_streams``): row b's draw uses the sub-stream
# sub_b = stream_key(keys[b], counters[b]) (the row key and the draw index), and from it
#   counter 0: uniform 0 chooses the epsilon-greedy branch, uniforms 1..K the alpha < 1 boosts;
#   counter 1 + r: Marsaglia-Tsang round r, uniforms (u1, u2, u) x K: a normal x = sqrt(-2 log u1)
#   cos(2 pi u2) (Box-Muller) and the acceptance uniform u.
# Entry j of row b takes the first accepted round. Nothing depends on another row or the batch size.
STREAM_ROUNDS = 4  # rounds drawn together before the one host check (P(entry pending) < 0.05^4 per entry)


def _log_standard_gamma_streams(a: torch.Tensor, sub: torch.Tensor, u0: torch.Tensor) -> torch.Tensor:
    """log Gamma(a, 1) (B, K), float64, by Marsaglia-Tsang from each row's sub-stream (layout above);
    ``u0`` (B, K): the boost uniforms (counter 0, uniforms 1..K)."""
    B, K = a.shape
    small, d, c = _mt_setup(a)
    out = torch.zeros_like(a)
    pending = torch.ones_like(a, dtype=torch.bool)
    r0 = 0
    while True:
        n = min(STREAM_ROUNDS, MAX_REJECTION_ROUNDS - r0)
        rounds = torch.arange(r0 + 1, r0 + n + 1, device=a.device, dtype=torch.int64)
        u = stream_uniform(sub.repeat(n), rounds.repeat_interleave(B), 3 * K).view(n, B, 3, K)
        x = torch.sqrt(-2.0 * torch.log(u[:, :, 0])) * torch.cos(2 * math.pi * u[:, :, 1])  # Box-Muller
        ok, val = _mt_accept(x, torch.log(u[:, :, 2]), d, c)  # (n, B, K)
        first = ok.to(torch.uint8).argmax(0, keepdim=True)  # the first accepted round of each entry
        take = pending & ok.any(0)
        out = torch.where(take, val.gather(0, first).squeeze(0), out)
        pending = pending & ~take
        r0 += n
        if not bool(pending.any()):  # one host check per STREAM_ROUNDS rounds
            break
        if r0 >= MAX_REJECTION_ROUNDS:
            raise RuntimeError(f"Gamma sampler: {int(pending.sum())} draws still rejected after "
                               f"{MAX_REJECTION_ROUNDS} rounds (alpha in [{float(a.min())}, {float(a.max())}])")
    return torch.where(small, out + torch.log(u0) / a, out)


def sample_policy_log_streams(alpha: torch.Tensor, epsilon: torch.Tensor | float, keys: torch.Tensor,
                              counters: torch.Tensor) -> torch.Tensor:
    """log a (B, K), float64, a ~ (1 - eps_b) Dir(alpha_b) + eps_b Dir(1, ..., 1) for every row b:
    per-row concentrations ``alpha`` (B, K), per-row ``epsilon`` (B,) (or one float), row b's random
    numbers from the counter-based stream (keys[b], counters[b]) alone (layout above), so a row's
    draw is the same alone or in any batch. Exact in log space (log a = logGamma - logsumexp, module
    docstring); no generator, and no host synchronisation but the input checks and one per
    ``STREAM_ROUNDS`` rejection rounds."""
    if alpha.dim() != 2:
        raise ValueError(f"alpha must be (B, K), got shape {tuple(alpha.shape)}")
    B, K = alpha.shape
    a = check_finite(alpha, "Dirichlet concentration").detach().double()
    if bool((a <= 0).any()):
        raise ValueError(f"Dirichlet concentrations must be > 0, got min {float(a.min())}")
    dev = a.device
    eps = torch.as_tensor(epsilon, dtype=torch.float64, device=dev).expand(B)
    if bool(((eps < 0) | (eps > 1) | ~torch.isfinite(eps)).any()):
        raise ValueError(f"epsilon must be in [0, 1], got {eps.tolist()}")
    keys, counters = keys.to(dev, torch.int64), counters.to(dev, torch.int64)
    if keys.shape != (B,) or counters.shape != (B,):
        raise ValueError(f"keys and counters must be ({B},), got {tuple(keys.shape)} and {tuple(counters.shape)}")
    sub = stream_subkeys(keys, counters)
    u0 = stream_uniform(sub, torch.zeros_like(sub), K + 1)
    explore = u0[:, 0] < eps  # epsilon-greedy branch
    a = torch.where(explore[:, None], torch.ones_like(a), a)
    g = _log_standard_gamma_streams(a, sub, u0[:, 1:])
    return g - torch.logsumexp(g, dim=-1, keepdim=True)


def sample_dirichlet_log_streams(alpha: torch.Tensor, keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """log a (B, K) for a ~ Dir(alpha_b), row b from the stream (keys[b], counters[b]): the epsilon = 0
    case of ``sample_policy_log_streams`` (the same draws)."""
    return sample_policy_log_streams(alpha, 0.0, keys, counters)


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
        return torch.softmax(check_finite(self.L, "policy.L"), dim=-1)

    def prior(self, s: torch.Tensor) -> torch.Tensor:
        """p (..., K) = s softmax(L), the transition prior P_theta(. | s)."""
        if s.shape[-1] != self.n_states:
            raise ValueError(f"state distributions have {s.shape[-1]} entries, the policy {self.n_states} states")
        return check_finite(s, "state s").to(self.L.dtype) @ self.transition()

    def concentration(self, s: torch.Tensor) -> torch.Tensor:
        """c p (..., K), clamped to at least ``CONC_FLOOR``."""
        c = check_finite(check_finite(self.log_c, "policy.log_c").exp(), "policy concentration exp(log_c)")
        return check_finite((c * self.prior(s)).clamp(min=CONC_FLOOR), "Dirichlet parameters c p")

    def dirichlet(self, s: torch.Tensor) -> torch.distributions.Dirichlet:
        """pi_theta(. | s) = Dir(c p) (without the epsilon-greedy mixture)."""
        return torch.distributions.Dirichlet(self.concentration(s))

    @torch.no_grad()
    def sample_log(self, s: torch.Tensor, epsilon: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """log a (..., K), a ~ pi~(. | s): Dir(c p) with probability 1 - epsilon, else Dir(1, ..., 1).
        Exact in log space (book/method.md); the same ``generator`` state gives the same draws."""
        _check_epsilon(epsilon)
        conc = self.concentration(check_simplex(s, "state s").to(self.L.device))
        dev = generator.device if generator is not None else conc.device
        explore = (torch.rand(conc.shape[:-1], generator=generator, device=dev) < epsilon).to(conc.device)
        conc = torch.where(explore[..., None], torch.ones_like(conc), conc)  # Sec. 5.4: pi~ = (1 - eps) Dir(c p) + eps Dir(1)
        return sample_dirichlet_log(conc, generator).to(conc.device)

    @torch.no_grad()
    def sample_log_streams(self, s: torch.Tensor, epsilon: torch.Tensor | float, keys: torch.Tensor,
                           counters: torch.Tensor) -> torch.Tensor:
        """log a (B, K), a ~ pi~(. | s_b) for each row of s (B, K), drawn from the counter-based stream
        (keys[b], counters[b]) of each row (``sample_policy_log_streams``); ``epsilon`` a float or (B,)."""
        return sample_policy_log_streams(self.concentration(s.to(self.L.device)), epsilon, keys, counters)

    @torch.no_grad()
    def sample(self, s: torch.Tensor, epsilon: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
        """a (..., K) ~ pi~(. | s): ``sample_log`` exponentiated (entries may underflow to 0; keep
        ``sample_log``'s output for log-densities)."""
        return self.sample_log(s, epsilon, generator).exp().to(self.L.dtype)

    def log_prob_log(self, log_a: torch.Tensor, s: torch.Tensor, epsilon: float = 0.0,
                     allowed: torch.Tensor | None = None) -> torch.Tensor:
        """log pi~(a | s) (...,) from log a (Eq. 16's log pi~): log[(1 - eps) Dir(a; c p) + eps Gamma(K)],
        by logaddexp. Both densities are on the (K-1)-simplex w.r.t. the same Lebesgue measure;
        Dir(a; 1) = Gamma(K) = (K-1)!. With ``allowed`` (..., K) bool (``ctrls.method.positions``: the
        draw renormalised over the allowed states A, log a = -inf elsewhere) the density of that draw:
        the same mixture of Dir(a_A; (c p)_A) and Dir(a_A; 1) = Gamma(|A|) on the allowed coordinates."""
        _check_epsilon(epsilon)
        if log_a.shape[-1] != self.n_states:
            raise ValueError(f"actions have {log_a.shape[-1]} entries, the policy {self.n_states} states")
        alpha = self.concentration(s)
        if allowed is None:
            log_a = check_finite(log_a, "log-action log a").to(self.L.dtype)
            log_dir = (torch.lgamma(alpha.sum(-1)) - torch.lgamma(alpha).sum(-1)
                       + ((alpha - 1) * log_a).sum(-1))  # log Dir(a; c p)
            log_uniform = torch.full_like(log_dir, math.lgamma(self.n_states))
        else:
            A = allowed.to(alpha.device, torch.bool).expand_as(alpha)
            finite = torch.isfinite(log_a)
            if bool((~A.any(-1)).any()) or bool(torch.where(A, ~finite, finite).any()):
                raise ValueError("a masked action must allow a state, be finite where allowed and have log a = -inf "
                                 "exactly where it is not allowed")
            log_a = log_a.masked_fill(~A, 0.0).to(self.L.dtype)  # 0 x -inf would be nan
            zero = torch.zeros_like(alpha)
            log_dir = (torch.lgamma(torch.where(A, alpha, zero).sum(-1)) - torch.where(A, torch.lgamma(alpha), zero).sum(-1)
                       + torch.where(A, (alpha - 1) * log_a, zero).sum(-1))  # log Dir(a_A; (c p)_A)
            log_uniform = torch.lgamma(A.sum(-1).to(log_dir.dtype))  # Dir(a_A; 1) = Gamma(|A|)
        if epsilon == 0:
            return log_dir
        if epsilon == 1:
            return log_uniform
        # Eq. 13: log pi~(a | s), the mixture
        return torch.logaddexp(log_dir + math.log1p(-epsilon), log_uniform + math.log(epsilon))

    def log_prob(self, a: torch.Tensor, s: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
        """log pi~(a | s) for a plain simplex vector a strictly inside the simplex (every a_j > 0).
        No clamp: an a_j that underflowed to 0 is an error. For sampled actions use
        ``log_prob_log`` with ``sample_log``'s output."""
        a = a.to(self.L.dtype)
        if bool((a <= 0).any()):
            raise ValueError("log_prob needs every a_j > 0 (an action from sample() may have underflowed); "
                             "pass sample_log()'s log a to log_prob_log instead")
        return self.log_prob_log(torch.log(a), s, epsilon)

    def entropy(self, s: torch.Tensor, kind: str = "categorical") -> torch.Tensor:
        """H(pi_theta(. | s)) (...,), Eq. 14: the categorical entropy -sum_j p_j log p_j of the
        mean next-state distribution p = s softmax(L) (default), or (``kind="dirichlet"``) the
        differential entropy of Dir(c p).

        Why the categorical reading is the default: Eq. 14 is a sum over a discrete action set A,
        and the discrete object the policy chooses among is the next latent state j, which the
        policy visits with probability p_j on average (E[a] = p). That entropy is bounded
        (0 <= H <= log K), is 0 exactly when the transition row collapses onto one state, and its
        gradient pushes L away from that collapse. It does not involve c: a large c makes the
        draws a concentrate around p but keeps E[a] = p, so the expected next state is unchanged;
        the epsilon-greedy mixture is what keeps the draws spread. The Dirichlet's differential
        entropy is not a sum over A, is unbounded below (-> -inf as c -> inf or as any c p_j -> 0)
        and is dominated by the tiny c p_j of a pretrained row, so as a bonus it mostly rewards
        lowering c; it stays an option."""
        if kind == "categorical":
            p = self.prior(s)
            return -(p * p.clamp(min=PROB_FLOOR).log()).sum(-1)  # Eq. 14
        if kind == "dirichlet":
            return self.dirichlet(s).entropy()
        raise ValueError(f"unknown entropy kind {kind!r}: categorical or dirichlet")


def check_simplex(s: torch.Tensor, what: str, tol: float = 1e-3) -> torch.Tensor:
    """Raise ValueError naming ``what`` unless every row of s is a distribution (finite, entries
    >= 0, summing to 1 within ``tol``); a state off the simplex would give a policy that is not one."""
    check_finite(s, what)
    x = s.detach().double()
    if bool((x < -tol).any()) or bool(((x.sum(-1) - 1).abs() > tol).any()):
        row = int((((x < -tol).any(-1)) | ((x.sum(-1) - 1).abs() > tol)).reshape(-1).nonzero()[0])
        raise ValueError(f"{what} is not on the simplex: row {row} has entries in "
                         f"[{float(x.reshape(-1, x.shape[-1])[row].min()):g}, {float(x.reshape(-1, x.shape[-1])[row].max()):g}] "
                         f"summing to {float(x.reshape(-1, x.shape[-1])[row].sum()):g}")
    return s


def _check_epsilon(epsilon: float) -> None:
    if not 0 <= epsilon <= 1:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")


def kl_to_prior(s_post: torch.Tensor, s_prev: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """KL(s_t || s_{t-1} softmax(L)) (M,) per row: the KL to the mixture prior, the relaxed objective's
    KL term (``ctrls.method.elbo.relaxed_terms``). Not Thm. 5.3's term: by convexity it is at most the
    expected KL (``expected_kl``), with equality when s_{t-1} is one-hot.
    0 log 0 = 0; the prior is clamped to at least ``PROB_FLOOR`` inside the log."""
    prior = s_prev.to(L.dtype) @ torch.softmax(check_finite(L, "transition logits L"), -1)
    post = s_post.to(L.dtype)
    return (torch.special.xlogy(post, post) - post * prior.clamp(min=PROB_FLOOR).log()).sum(-1)


def expected_kl(s_post: torch.Tensor, s_prev: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """E_{z_{t-1} ~ Q}[KL(Q(z_t) || P_theta(z_t | z_{t-1}))] = sum_i s_{t-1,i} KL(s_t || softmax(L)_i) (Thm. 5.3).

    s_post, s_prev (S, K), L (K, K) -> (S,) in float64. 0 log 0 = 0; log softmax(L) is exact (no floor).
    By convexity of KL in its second argument it is >= KL(s_t || s_{t-1} softmax(L)) (``kl_to_prior``),
    with equality when s_{t-1} is one-hot."""
    post, prev = s_post.double(), s_prev.double()
    log_A = torch.log_softmax(L.double(), -1)
    return torch.special.xlogy(post, post).sum(-1) - (post * (prev @ log_A)).sum(-1)  # Thm. 5.3, expected KL


def soft_counts_init(s_prev: torch.Tensor, s_next: torch.Tensor, smoothing: float = 0.1) -> torch.Tensor:
    """L (K, K) = log of the row-normalised soft transition counts C + smoothing, C = s_prev^T s_next.

    This is the exact minimiser of Thm. 5.3's expected KL (``expected_kl``) summed over the pairs,
    plus the smoothing penalty: sum_t expected_kl_t = const - sum_ij C_ij log A_ij with A = softmax(L),
    minimised row by row under sum_j A_ij = 1 by A_ij = C_ij / sum_j C_ij (Gibbs' inequality). With
    ``smoothing`` = lambda > 0 pseudo-counts per entry, A_ij = (C_ij + lambda) / (sum_j C_ij + K lambda)
    minimises sum_t expected_kl_t - lambda sum_ij log A_ij exactly (the MAP row under a symmetric
    Dirichlet(1 + lambda) prior). The smoothing shrinks row i toward uniform by the fraction
    K lambda / (n_i + K lambda), n_i = sum_j C_ij its soft visits: negligible for a row seen often,
    and it keeps every entry of L finite (a row never visited is uniform)."""
    if smoothing <= 0 or not math.isfinite(smoothing):
        raise ValueError(f"smoothing must be a finite pseudo-count > 0 (0 gives log 0 = -inf in L), got {smoothing}")
    counts = s_prev.double().T @ s_next.double() + smoothing  # Thm. 5.3: the expected KL's minimiser (smoothed)
    return (counts / counts.sum(-1, keepdim=True)).log().float()


FIT_METHODS = ("expected_kl", "mixture")


def fit_transitions(s_prev: torch.Tensor, s_next: torch.Tensor, n_states: int, steps: int = 300, lr: float = 0.05,
                    smoothing: float = 0.1, method: str = "expected_kl") -> tuple[torch.Tensor, list[float]]:
    """Fit L (K, K) to consecutive state pairs. Returns L and the history of the fitted objective
    (mean per pair, nats).

    s_prev, s_next (M, K): state distributions of consecutive steps (s_0 of the prompt before the
    first step).

    - ``method="expected_kl"`` (default; Alg. 1 fits P_theta by Thm. 5.3's KL term): the closed form
      ``soft_counts_init``, the exact minimiser of the mean expected KL sum_i s_{t-1,i} KL(s_t ||
      softmax(L)_i) with ``smoothing`` pseudo-counts (documented there). ``steps`` and ``lr`` are
      unused; the history is one value, the mean expected KL at the returned L.
    - ``method="mixture"``: minimise the mean mixture-prior KL(s_next || s_prev softmax(L))
      (``kl_to_prior``, the relaxed objective's term, not the theorem's): start from the soft counts,
      refine with ``steps`` Adam steps, return the L with the lowest mean KL seen (Adam's first steps
      can overshoot a start already near the optimum, as with one-hot states) and the mean KL at the
      start and after every step (``steps + 1`` values). With one-hot s_prev both objectives agree."""
    if method not in FIT_METHODS:
        raise ValueError(f"unknown transition fit {method!r}: one of {FIT_METHODS}")
    if s_prev.shape != s_next.shape or s_prev.dim() != 2 or s_prev.shape[-1] != n_states:
        raise ValueError(f"transition pairs must both be (M, {n_states}), "
                         f"got {tuple(s_prev.shape)} and {tuple(s_next.shape)}")
    if len(s_prev) == 0:
        raise ValueError("no transition pairs to fit")
    for name, s in (("s_prev", s_prev), ("s_next", s_next)):
        bad = ~torch.isfinite(s).all(-1)
        if bad.any():
            raise ValueError(f"{name} row {int(bad.nonzero()[0])} is not finite")
    L0 = soft_counts_init(s_prev, s_next, smoothing)
    if method == "expected_kl":
        return L0, [float(expected_kl(s_next, s_prev, L0).mean())]  # Thm. 5.3: the KL term at its minimiser
    L = torch.nn.Parameter(L0)
    opt = torch.optim.Adam([L], lr=lr)
    history: list[float] = []
    best = L.detach().clone()
    for step in range(steps + 1):
        loss = kl_to_prior(s_next, s_prev, L).mean()  # the mixture-prior KL (relaxed objective), not Thm. 5.3's
        history.append(float(loss.detach()))
        if history[-1] <= min(history):
            best = L.detach().clone()
        if step == steps:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    return best, history


ACTION_FLOOR = 1e-30  # posterior entries are floored here (then renormalised) before the Dirichlet fit of c


def fit_concentration(s_prev: torch.Tensor, s_next: torch.Tensor, L: torch.Tensor,
                      bounds: tuple[float, float] = (1e-2, 1e4)) -> tuple[float, dict]:
    """Maximum-likelihood concentration c of pi_theta(a | s) = Dir(a; c p), p = s_prev softmax(L), with the
    posterior states of the training steps as the actions a (Sec. 5.4's Dirichlet, fitted before RL).

    The paper learns c by RL and leaves its start open; our default starts it at ``policy.concentration``.
    Fitting it to the posteriors makes the policy's draws as sharp, on average, as the states the adapter
    was trained on: a c far too large gives draws near the diffuse mean p, which the adapter never saw.

    Log-likelihood per pair: lgamma(c) - sum_j lgamma(c p_j) + sum_j (c p_j - 1) log a_j (Dirichlet
    density with the same ``CONC_FLOOR`` clamp on c p as the sampler). The precision's log-likelihood
    with the means fixed is concave in c (Minka 2000), so a bounded scalar search on log c finds its
    maximum. Posteriors are often exactly 0 in some entries (a softmax underflows), where the density
    is 0 for every c; they are floored at ``ACTION_FLOOR`` and renormalised. The floor biases c up
    where true log a_j would lie below log ``ACTION_FLOOR`` (~ -69): floored actions look less sparse
    than they are (measured on Dirichlet draws with c p_j ~ 1e-3: c = 3 fitted as 3.8). Without such
    entries the fit recovers c (tests/method/test_policy.py).

    Returns c and {pairs, loglik_per_pair at c, c_at_bound (True where the maximum is at a bound),
    mean_max_posterior} (the sharpness the fit matches in the mean)."""
    from scipy.optimize import minimize_scalar

    if s_prev.shape != s_next.shape or s_prev.dim() != 2 or s_prev.shape[-1] != L.shape[0]:
        raise ValueError(f"fit_concentration: s_prev, s_next must both be (M, {L.shape[0]}), "
                         f"got {tuple(s_prev.shape)} and {tuple(s_next.shape)}")
    if len(s_prev) == 0:
        raise ValueError("fit_concentration: no transition pairs")
    for name, s in (("s_prev", s_prev), ("s_next", s_next), ("L", L)):
        check_finite(s, name)
    p = (s_prev.double() @ torch.softmax(L.double(), -1))
    a = s_next.double().clamp(min=ACTION_FLOOR)
    log_a = (a / a.sum(-1, keepdim=True)).log()

    def nll(log_c: float) -> float:
        alpha = (math.exp(log_c) * p).clamp(min=CONC_FLOOR)  # the sampler's clamp
        ll = torch.lgamma(alpha.sum(-1)) - torch.lgamma(alpha).sum(-1) + ((alpha - 1) * log_a).sum(-1)
        return -float(ll.mean())

    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    res = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
    c = float(math.exp(res.x))
    at_bound = bool(min(abs(res.x - lo), abs(res.x - hi)) < 1e-2)
    return c, {"pairs": len(s_prev), "loglik_per_pair": -float(res.fun), "c_at_bound": at_bound,
               "mean_max_posterior": float(s_next.double().max(-1).values.mean())}
