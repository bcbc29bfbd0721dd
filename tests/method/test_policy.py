"""ctrls.method.policy: the transition fit recovers known Markov chains and maximises the reported bound;
the epsilon-greedy Dirichlet policy's density integrates to one, its score has mean zero (masked or not),
its samplers match the Dirichlet's moments and a stream draw depends only on its row; bad inputs are refused."""
import math

import numpy as np
import pytest
import torch

from ctrls.method.elbo import elbo_from_logliks
from ctrls.method.policy import (
    TransitionPolicy,
    expected_kl,
    fit_transitions,
    kl_to_prior,
    sample_dirichlet,
    sample_dirichlet_log_streams,
    sample_policy_log_streams,
    soft_counts_init,
)

TRUE = torch.tensor([[0.7, 0.1, 0.1, 0.1],
                     [0.2, 0.5, 0.2, 0.1],
                     [0.05, 0.05, 0.6, 0.3],
                     [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)


def markov_chain(n=20000, seed=0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    cum, u = TRUE.cumsum(1).numpy(), rng.random(n)
    x = [0]
    for t in range(n):
        x.append(min(int(np.searchsorted(cum[x[-1]], u[t])), 3))
    return torch.tensor(x)


def test_fit_recovers_a_known_markov_chain_from_one_hot_states(one_thread):
    s = torch.nn.functional.one_hot(markov_chain(), 4).float()
    L, hist = fit_transitions(s[:-1], s[1:], 4, steps=50, method="mixture")
    assert (torch.softmax(L, -1) - TRUE).abs().max() < 0.05
    assert len(hist) == 51
    # with one-hot states both KLs agree, and so do both fits
    L_exp, hist_exp = fit_transitions(s[:-1], s[1:], 4)
    assert (torch.softmax(L_exp, -1) - TRUE).abs().max() < 0.05 and len(hist_exp) == 1
    # the returned L is the best iterate: its KL is the history's minimum
    assert float(kl_to_prior(s[1:], s[:-1], L).mean()) == pytest.approx(min(hist), rel=1e-6)


def test_fit_recovers_the_chain_from_soft_states(one_thread):
    # every step's state distribution is soft: state j is observed as the row M[j] (mass 0.75 on j).
    # The KL fit is then exact at T = M^-1 TRUE M (M[x] T = E[s_next | x] for every x), and
    # M T M^-1 gives the true chain back.
    g = torch.Generator().manual_seed(1)
    M = 0.75 * torch.eye(4, dtype=torch.float64) + 0.25 * torch.softmax(torch.randn(4, 4, generator=g, dtype=torch.float64), -1)
    s = M[markov_chain(seed=1)].float()
    L, hist = fit_transitions(s[:-1], s[1:], 4, steps=100, method="mixture")
    est = torch.softmax(L.double(), -1)
    target = torch.linalg.solve(M, TRUE @ M)
    assert target.min() > 0  # a valid chain: the fit can reach it
    assert (est - target).abs().max() < 0.05
    assert (M @ est @ torch.linalg.inv(M) - TRUE).abs().max() < 0.05
    # the soft-count start alone is biased (max error ~0.14 here); the KL refinement removes that
    L0, _ = fit_transitions(s[:-1], s[1:], 4, steps=0, method="mixture")
    assert (torch.softmax(L0.double(), -1) - target).abs().max() > 0.1 and hist[-1] < hist[0]


def soft_pairs(n=3000, K=8, seed=0):
    """n soft (s_prev, s_next) pairs on K states (by default K = 8 and 3,000 pairs): Dirichlet
    draws around the rows of a random sticky chain."""
    g = torch.Generator().manual_seed(seed)
    A = torch.softmax(2 * torch.randn(K, K, generator=g, dtype=torch.float64), -1)
    prev = torch.distributions.Dirichlet(torch.full((K,), 0.3, dtype=torch.float64)).sample((n,))
    nxt = torch.stack([torch.distributions.Dirichlet(5 * (p @ A) + 0.05).sample() for p in prev])
    return prev.float(), nxt.float()


def test_the_default_fit_maximises_the_reported_bound_over_L(one_thread):
    """Thm. 5.3's bound (``elbo_from_logliks``, what pretraining reports) depends on L through the
    expected KL only. The default fit is its exact minimiser: every perturbation of L lowers the
    bound (smoothing -> 0), and with the default smoothing every perturbation raises the penalised
    objective the docstring names. The mixture fit (the old default) gives a lower bound."""
    torch.manual_seed(0)
    prev, nxt = soft_pairs()
    K = prev.shape[1]
    loglik = -torch.rand(len(prev), K, dtype=torch.float64) * 30  # the reconstruction does not involve L

    def bound(L):
        return float(elbo_from_logliks(loglik, nxt, prev, L).value) / len(prev)

    L, hist = fit_transitions(prev, nxt, K, smoothing=1e-9)
    assert hist == [pytest.approx(float(expected_kl(nxt, prev, L).mean()))]
    g = torch.Generator().manual_seed(3)
    for scale in (1e-2, 1e-1, 1.0):
        for _ in range(20):
            assert bound(L + scale * torch.randn(K, K, generator=g)) < bound(L)
    lam = 0.1  # the default smoothing: the exact minimiser of the penalised expected KL
    Ld = fit_transitions(prev, nxt, K)[0]
    torch.testing.assert_close(Ld, soft_counts_init(prev, nxt, lam))

    def penalised(L):
        return float(expected_kl(nxt, prev, L).sum() - lam * torch.log_softmax(L.double(), -1).sum())

    for _ in range(20):
        assert penalised(Ld + 0.05 * torch.randn(K, K, generator=g)) > penalised(Ld)
    assert abs(bound(Ld) - bound(L)) < 1e-3  # the smoothing costs next to nothing here
    Lm, _ = fit_transitions(prev, nxt, K, method="mixture")
    assert bound(Lm) < bound(Ld) - 0.01


def test_fit_names_an_unknown_method_and_a_bad_smoothing():
    s = torch.ones(5, 3) / 3
    with pytest.raises(ValueError, match="unknown transition fit 'em'"):
        fit_transitions(s, s, 3, method="em")
    with pytest.raises(ValueError, match="smoothing must be"):
        fit_transitions(s, s, 3, smoothing=0.0)


def test_fit_rejects_bad_pairs():
    with pytest.raises(ValueError, match=r"\(M, 3\)"):
        fit_transitions(torch.ones(5, 3) / 3, torch.ones(4, 3) / 3, 3)
    bad = torch.ones(5, 3) / 3
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="s_next row 2"):
        fit_transitions(torch.ones(5, 3) / 3, bad, 3)


def test_kl_to_prior_is_zero_only_at_the_prior():
    L = torch.randn(3, 3)
    s_prev = torch.softmax(torch.randn(5, 3), -1)
    prior = s_prev @ torch.softmax(L, -1)
    torch.testing.assert_close(kl_to_prior(prior, s_prev, L), torch.zeros(5), atol=1e-6, rtol=0)
    assert (kl_to_prior(torch.softmax(torch.randn(5, 3), -1), s_prev, L) > 0).all()
    one_hot = torch.eye(3)[[2, 0, 1, 1, 0]]  # KL(one-hot j || prior) = -log prior_j
    torch.testing.assert_close(kl_to_prior(one_hot, s_prev, L), -prior[torch.arange(5), [2, 0, 1, 1, 0]].log())


def _policy(K=3, c=6.0):
    pol = TransitionPolicy(K, concentration=c)
    with torch.no_grad():
        pol.L.copy_(torch.tensor([[0.2, 0.1, 0.4], [0.0, 0.3, 0.1], [0.5, 0.0, 0.0]])[:K, :K])
    return pol


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0])
def test_epsilon_greedy_density_integrates_to_one(eps):
    pol = _policy()
    s = torch.tensor([[0.3, 0.3, 0.4]])
    assert pol.concentration(s).min() >= 1  # a smooth density: the midpoint rule is accurate
    m = 600  # midpoint rule on the 2-simplex, density w.r.t. Lebesgue measure on (a1, a2)
    g = (torch.arange(m, dtype=torch.float64) + 0.5) / m
    a1, a2 = torch.meshgrid(g, g, indexing="ij")
    inside = (a1 + a2) < 1
    a = torch.stack([a1[inside], a2[inside], 1 - a1[inside] - a2[inside]], -1).float()
    dens = pol.log_prob(a, s.expand(len(a), 3), eps).detach().double().exp()
    assert float(dens.sum() / m**2) == pytest.approx(1.0, abs=1e-2)


def test_epsilon_zero_is_the_dirichlet_one_is_uniform_and_between_is_the_mixture():
    pol = _policy()
    s = torch.softmax(torch.randn(6, 3), -1)
    a = torch.softmax(torch.randn(6, 3), -1)
    ref = torch.distributions.Dirichlet(pol.log_c.exp() * pol.prior(s)).log_prob(a)
    torch.testing.assert_close(pol.log_prob(a, s, 0.0), ref)
    torch.testing.assert_close(pol.log_prob(a, s, 1.0), torch.full((6,), math.lgamma(3)))
    torch.testing.assert_close(pol.log_prob(a, s, 0.25), torch.log(0.75 * ref.exp() + 0.25 * 2.0))
    with pytest.raises(ValueError, match="epsilon"):
        pol.log_prob(a, s, 1.5)


def test_log_prob_refuses_an_underflowed_action_instead_of_clamping():
    pol = TransitionPolicy(4, concentration=0.5)
    a = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="log_prob_log"):
        pol.log_prob(a, torch.full((1, 4), 0.25), 0.1)


def test_log_prob_log_equals_log_prob_inside_the_simplex():
    pol = _policy()
    s = torch.softmax(torch.randn(6, 3), -1)
    a = torch.softmax(torch.randn(6, 3), -1)
    torch.testing.assert_close(pol.log_prob_log(a.log(), s, 0.3), pol.log_prob(a, s, 0.3))


def sharp_policy(K=16, diag=0.98, c=20.0):
    """Every row puts ``diag`` on its own state and spreads the rest: c p_j = 0.027 off the diagonal,
    so sampled a_j are mostly far below 1e-6."""
    pol = TransitionPolicy(K, concentration=c)
    off = (1 - diag) / (K - 1)
    with torch.no_grad():
        pol.L.copy_(torch.full((K, K), math.log(off)) + torch.eye(K) * (math.log(diag) - math.log(off)))
    return pol


SAMPLERS = ["generator", "streams"]


def score_batches(pol, s, eps, n_batches=40, per=500, seed=0, log_prob=None, sampler="generator"):
    """Batch means of the score grad_theta log pi~(a | s), a ~ pi~(. | s): (n_batches, K*K + 1),
    the L entries then log c. The batch means are iid, so their mean and standard error give a z-test.
    ``sampler``: ``sample_log`` with a generator, or ``sample_log_streams`` (row i of batch b: stream
    (seed, b * per + i), draw index 0)."""
    g = torch.Generator().manual_seed(seed)
    log_prob = log_prob or (lambda log_a, ss: pol.log_prob_log(log_a, ss, eps))
    out = []
    for b in range(n_batches):
        ss = s.expand(per, pol.n_states)
        if sampler == "streams":
            keys = torch.full((per,), seed, dtype=torch.long) * 1_000_003 + b * per + torch.arange(per)
            log_a = pol.sample_log_streams(ss, eps, keys, torch.zeros(per, dtype=torch.long))
        else:
            log_a = pol.sample_log(ss, eps, generator=g)
        pol.zero_grad()
        log_prob(log_a, ss).mean().backward()
        out.append(torch.cat([pol.L.grad.flatten(), pol.log_c.grad.view(1)]).double())
    return torch.stack(out)


def z_scores(G):
    mean, se = G.mean(0), G.std(0) / math.sqrt(len(G))
    moving = se > 0
    assert torch.equal(mean[~moving], torch.zeros_like(mean[~moving]))  # rows of L that s does not touch
    return mean[moving] / se[moving], mean, se


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("eps", [0.0, 0.3])
@pytest.mark.parametrize("case", ["sharp K=16", "flat K=64"])
def test_the_score_has_mean_zero(one_thread, eps, case, sampler):
    """E_{a ~ pi~}[grad log pi~(a | s)] = 0 for L and log c (the identity REINFORCE rests on), with
    either sampler. The old clamp-then-log evaluation gave +11.4 for d/d log c on the sharp row."""
    if case == "sharp K=16":
        pol, s = sharp_policy(), torch.nn.functional.one_hot(torch.tensor([3]), 16).float()
    else:
        pol, s = TransitionPolicy(64, concentration=20.0), torch.softmax(torch.randn(1, 64), -1)
    z, mean, se = z_scores(score_batches(pol, s, eps, sampler=sampler))
    assert z.abs().max() < 5.0, f"max |z| {float(z.abs().max()):.1f}; d/dlog c mean {float(mean[-1]):.3f} +- {float(se[-1]):.3f}"


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_the_old_clamped_score_is_detectably_biased(one_thread, sampler):
    """The same z-test sees the bias of a clamped log-density: the test above can fail."""
    pol, s = sharp_policy(), torch.nn.functional.one_hot(torch.tensor([3]), 16).float()

    def clamped(log_a, ss):
        a = log_a.exp().float().clamp(min=1e-6)
        return pol.log_prob_log((a / a.sum(-1, keepdim=True)).log(), ss, 0.0)

    z, mean, _ = z_scores(score_batches(pol, s, 0.0, log_prob=clamped, sampler=sampler))
    assert z.abs().max() > 10 and float(mean[-1]) > 5  # d/d log c: about +11


@pytest.mark.parametrize("alpha", [float("nan"), float("inf")])
def test_non_finite_parameters_raise_instead_of_hanging(alpha):
    from ctrls.method.policy import NonFiniteError
    pol = TransitionPolicy(4)
    s = torch.full((2, 4), 0.25)
    with torch.no_grad():
        pol.L[1, 2] = alpha
    with pytest.raises(NonFiniteError, match=r"policy\.L.*\[1, 2\]"):
        pol.sample(torch.eye(4)[1:2], 0.1, generator=torch.Generator().manual_seed(0))
    pol = TransitionPolicy(4)
    with torch.no_grad():
        pol.log_c.fill_(1000.0)  # exp overflows to inf
    with pytest.raises(NonFiniteError, match="log_c"):
        pol.sample(s, 0.0, generator=torch.Generator().manual_seed(0))
    with pytest.raises(NonFiniteError, match="state"):
        TransitionPolicy(4).sample(torch.tensor([[0.5, float("nan"), 0.25, 0.25]]), 0.0)
    with pytest.raises(ValueError, match="concentration"):
        sample_dirichlet(torch.tensor([1.0, alpha, 2.0]))
    with pytest.raises(ValueError, match="> 0"):
        sample_dirichlet(torch.tensor([1.0, 0.0, 2.0]))


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_dirichlet_sampler_matches_the_moments(one_thread, sampler):
    alpha = torch.tensor([0.3, 1.0, 2.5, 8.0])  # below and above 1: both branches of the sampler
    if sampler == "streams":
        la = sample_dirichlet_log_streams(alpha.expand(40000, 4), torch.arange(40000) * 7919 - 5,
                                          torch.full((40000,), 3))
        assert la.dtype == torch.float64
        torch.testing.assert_close(torch.logsumexp(la, -1), torch.zeros(40000, dtype=torch.float64))
        a = la.exp().float()
    else:
        a = sample_dirichlet(alpha.expand(40000, 4), torch.Generator().manual_seed(0))
    mean = alpha / alpha.sum()
    var = mean * (1 - mean) / (alpha.sum() + 1)
    assert torch.allclose(a.sum(-1), torch.ones(40000)) and (a >= 0).all()
    torch.testing.assert_close(a.mean(0), mean, atol=4e-3, rtol=0)
    torch.testing.assert_close(a.var(0), var, atol=0, rtol=0.05)


def test_sampling_mean_determinism_and_exploration(one_thread):
    pol = _policy(c=50.0)
    s = torch.tensor([[1.0, 0.0, 0.0]]).expand(4000, 3)
    gen = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    a = pol.sample(s, 0.0, generator=gen(0))
    torch.testing.assert_close(a.mean(0), pol.prior(s[:1])[0].detach(), atol=0.01, rtol=0)
    assert torch.equal(a, pol.sample(s, 0.0, generator=gen(0)))
    assert not torch.equal(a, pol.sample(s, 0.0, generator=gen(1)))
    torch.manual_seed(0)  # the global RNG does not enter a seeded draw
    b = pol.sample(s, 0.3, generator=gen(5))
    torch.manual_seed(1)
    assert torch.equal(b, pol.sample(s, 0.3, generator=gen(5)))
    # with eps = 1 the draws are uniform on the simplex: mean 1/K, much wider spread
    u = pol.sample(s, 1.0, generator=gen(0))
    torch.testing.assert_close(u.mean(0), torch.full((3,), 1 / 3), atol=0.02, rtol=0)
    assert u.std(0).min() > 3 * a.std(0).max()
    # eps = 0.5: half the rows come from the uniform draws, so half as many land far from p
    p = pol.prior(s[:1]).detach()
    far = lambda x: float(((x - p).abs().max(-1).values > 5 * a.std(0).max()).float().mean())  # noqa: E731
    assert far(a) < 0.01 and far(u) > 0.3
    assert far(pol.sample(s, 0.5, generator=gen(2))) == pytest.approx(0.5 * far(u), abs=0.04)


def test_entropy_and_gradients():
    pol = TransitionPolicy(5)
    s = torch.softmax(torch.randn(7, 5), -1)
    torch.testing.assert_close(pol.entropy(s), torch.full((7,), math.log(5)))  # L = 0: uniform rows
    d = pol.entropy(s, kind="dirichlet")
    torch.testing.assert_close(d, torch.distributions.Dirichlet(torch.full((7, 5), 4.0)).entropy())
    a = pol.sample(s, 0.2, generator=torch.Generator().manual_seed(3))
    (pol.log_prob(a, s, 0.2).sum() + pol.entropy(s).sum()).backward()
    assert pol.L.grad is not None and pol.L.grad.abs().sum() > 0
    assert pol.log_c.grad is not None and pol.log_c.grad != 0
    with pytest.raises(ValueError):
        pol.entropy(s, kind="renyi")


def test_a_stream_draw_depends_only_on_its_row():
    """A row's draw (concentration, epsilon, key, draw index) is the same alone or in a batch of 64
    with other concentrations, epsilons and keys, and at another position in the batch."""
    g = torch.Generator().manual_seed(0)
    B, K = 64, 16
    alpha = torch.exp(3 * torch.randn(B, K, generator=g) - 2)  # 0.0002 ... 400: both branches, tiny c p
    eps = torch.rand(B, generator=g)
    keys, counters = torch.randint(-2**62, 2**62, (B,), generator=g), torch.randint(0, 20, (B,), generator=g)
    batch = sample_policy_log_streams(alpha, eps, keys, counters)
    assert batch.dtype == torch.float64 and torch.isfinite(batch).all()
    assert batch.min() < -50  # tiny concentrations: log a far below any float floor, kept exactly
    for b in (0, 17, 63):
        alone = sample_policy_log_streams(alpha[b:b + 1], eps[b:b + 1], keys[b:b + 1], counters[b:b + 1])
        assert torch.equal(alone[0], batch[b])
    perm = torch.randperm(B, generator=g)
    assert torch.equal(sample_policy_log_streams(alpha[perm], eps[perm], keys[perm], counters[perm]), batch[perm])
    # another draw index or key gives another draw
    assert not torch.equal(sample_policy_log_streams(alpha, eps, keys, counters + 1), batch)
    # the method's epsilon equals the function's with the policy's concentrations
    pol = _policy(c=4.0)
    s = torch.softmax(torch.randn(5, 3, generator=g), -1)
    torch.testing.assert_close(pol.sample_log_streams(s, 0.3, keys[:5], counters[:5]),
                               sample_policy_log_streams(pol.concentration(s), 0.3, keys[:5], counters[:5]), rtol=0, atol=0)


def test_stream_epsilon_mixes_in_the_uniform_draws(one_thread):
    """Per-row epsilon: rows with eps = 1 are uniform on the simplex (mean 1/K), rows with eps = 0 follow
    Dir(alpha), and eps = 0.5 mixes the two half and half."""
    n, K = 20000, 3
    alpha = torch.tensor([40.0, 5.0, 5.0]).expand(n, K)
    keys, zero = torch.arange(n), torch.zeros(n, dtype=torch.long)
    a0 = sample_policy_log_streams(alpha, torch.zeros(n), keys, zero).exp()
    a1 = sample_policy_log_streams(alpha, torch.ones(n), keys, zero).exp()
    torch.testing.assert_close(a0.mean(0), alpha[0].double() / 50, atol=5e-3, rtol=0)
    torch.testing.assert_close(a1.mean(0), torch.full((K,), 1 / 3, dtype=torch.float64), atol=1e-2, rtol=0)
    half = sample_policy_log_streams(alpha, torch.tensor([0.0, 0.5]).repeat(n // 2), keys, zero).exp()
    torch.testing.assert_close(half[0::2], a0[0::2], rtol=0, atol=0)  # eps = 0 rows: unchanged
    far = lambda x: float(((x[:, 0] - 0.8).abs() > 0.3).double().mean())  # noqa: E731
    assert far(a0) < 0.01 and far(half[1::2]) == pytest.approx(0.5 * far(a1), abs=0.03)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_stream_sampler_rejects_bad_concentrations(bad):
    alpha = torch.ones(3, 4)
    alpha[1, 2] = bad
    keys = torch.arange(3)
    with pytest.raises(ValueError, match="concentration" if bad != bad or bad == float("inf") else "> 0"):
        sample_dirichlet_log_streams(alpha, keys, keys)
    with pytest.raises(ValueError, match="epsilon"):
        sample_policy_log_streams(torch.ones(3, 4), torch.tensor([0.0, 1.5, 0.0]), keys, keys)
    with pytest.raises(ValueError, match=r"\(B, K\)"):
        sample_dirichlet_log_streams(torch.ones(4), keys[:1], keys[:1])


# ---- raise instead of returning NaN -----------------------------------------------


def test_fit_transitions_without_smoothing_refuses_a_state_never_left():
    import torch

    from ctrls.method.policy import fit_transitions

    eye = torch.eye(3)
    s_prev, s_next = eye[[0, 1, 0]], eye[[1, 0, 0]]  # state 2 is never left
    with pytest.raises(ValueError, match=r"state 2 .* never left|smoothing must be"):  # either refusal, never NaN
        fit_transitions(s_prev, s_next, 3, steps=2, smoothing=0.0)
    L, hist = fit_transitions(s_prev, s_next, 3, steps=2, smoothing=0.1)
    assert torch.isfinite(L).all() and all(map(math.isfinite, hist))


def test_kl_to_prior_refuses_an_infinite_logit():
    import torch

    from ctrls.method.policy import NonFiniteError, kl_to_prior

    L = torch.zeros(3, 3)
    L[0, 1] = float("inf")
    s = torch.eye(3)
    with pytest.raises(NonFiniteError, match="transition logits L"):
        kl_to_prior(s, s, L)


@pytest.mark.parametrize("s", [[0.5, 0.5, 0.5], [1.5, -0.5, 0.0], [0.0, 0.0, 0.0]])
def test_sample_log_refuses_a_state_off_the_simplex(s):
    import torch

    from ctrls.method.policy import TransitionPolicy

    with pytest.raises(ValueError, match="not on the simplex"):
        TransitionPolicy(3).sample_log(torch.tensor(s))


def test_fit_concentration_recovers_the_dirichlet_precision_of_known_draws():
    """Draws a ~ Dir(c p) with p = s_prev softmax(L) for a known L and c: the maximum-likelihood c is
    within 5% of the truth over three orders of magnitude, and it orders them."""
    from ctrls.method.policy import fit_concentration, sample_dirichlet_log

    g = torch.Generator().manual_seed(0)
    K = 8
    L = torch.randn(K, K, generator=g) * 0.5
    prev = torch.nn.functional.one_hot(torch.randint(0, K, (4000,), generator=g), K).double()
    p = prev @ torch.softmax(L.double(), -1)
    fits = []
    for c in (1.0, 5.0, 20.0, 100.0):
        a = sample_dirichlet_log(c * p, g).exp()
        got, info = fit_concentration(prev, a, L)
        assert got == pytest.approx(c, rel=0.05) and not info["c_at_bound"] and info["pairs"] == 4000
        fits.append(got)
    assert fits == sorted(fits)
    with pytest.raises(ValueError, match="must both be"):
        fit_concentration(prev[:, :3], a[:, :3], L)


def test_the_transitions_stage_fits_c_and_the_model_uses_it(tmp_path):
    """policy.fit_concentration: the transitions stage saves the fitted c beside L and reports it; the
    model built from the stage's outputs samples with that c; off (the default) it keeps
    policy.concentration and saves no c."""
    import types

    from ctrls.config.schema import load_config
    from ctrls.method.policy import fit_concentration, sample_dirichlet_log
    from ctrls.stages.pretrain import build_model, fit_transition_model, transition_pairs

    g = torch.Generator().manual_seed(1)
    K, Q, T = 4, 60, 5
    L_true = torch.randn(K, K, generator=g)
    s0 = torch.softmax(torch.randn(Q, K, generator=g) * 3, -1)
    index, post = [], []
    for q in range(Q):
        prev = s0[q]
        for t in range(T):
            a = sample_dirichlet_log((3.0 * prev @ torch.softmax(L_true, -1)).clamp(min=1e-3), g).exp().float()
            post.append(a)
            index.append((q, 0, t))
            prev = a
    st = {"index": torch.tensor(index), "s_post": torch.stack(post), "s0": s0,
          "heldout": torch.zeros(len(index), dtype=torch.bool), "centroids": torch.randn(K, 2),
          "requested_k": torch.tensor(K), "tau": torch.tensor(1.0)}
    (tmp_path / "states").mkdir()
    torch.save(st, tmp_path / "states" / "states.pt")
    bb = types.SimpleNamespace(hidden_size=8)
    for fit in (True, False):
        out = tmp_path / f"transitions_{fit}"
        out.mkdir()
        cfg = load_config("smoke", [f"policy.fit_concentration={str(fit).lower()}", "policy.concentration=20"])
        summary = fit_transition_model(cfg, tmp_path / "states", out)
        tr = torch.load(out / "transitions.pt", weights_only=True)
        model = build_model(cfg, bb, st, tr)
        c_model = float(model.policy.log_c.exp())
        if fit:
            prev, nxt = transition_pairs(st)
            want, _ = fit_concentration(prev, nxt, tr["L"])
            assert summary["concentration"] == pytest.approx(want) and float(tr["c"]) == pytest.approx(want)
            assert c_model == pytest.approx(want, rel=1e-5) and 1.0 < want < 10.0  # near the 3 it was drawn with
        else:
            assert "c" not in tr and "concentration" not in summary
            assert c_model == pytest.approx(20.0, rel=1e-5)


def _masked(pol, allowed, eps):
    """A position-masked draw's log-prob (``allowed`` (K,) bool) and its sampler: ``sample_log`` renormalised
    over the allowed states, as ``ctrls.method.positions.PositionMask.mask_log`` draws it."""
    from ctrls.method.positions import PositionMask

    pm = PositionMask(allowed[None], allowed[None].long())

    def draw(ss, g):
        return pm.mask_log(pol.sample_log(ss, eps, generator=g), 0)

    return draw, (lambda log_a, ss: pol.log_prob_log(log_a, ss, eps, allowed=allowed.expand_as(log_a)))


@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_a_masked_draws_density_is_the_dirichlet_of_the_allowed_states(eps):
    """Against torch.distributions on the sub-simplex: (1 - eps) Dir(a_A; (c p)_A) + eps Gamma(|A|)."""
    torch.manual_seed(0)
    pol = TransitionPolicy(5, concentration=3.0)
    with torch.no_grad():
        pol.L.normal_()
    allowed = torch.tensor([True, False, True, True, False])
    draw, logp = _masked(pol, allowed, eps)
    s = torch.softmax(torch.randn(7, 5), -1)
    log_a = draw(s, torch.Generator().manual_seed(1))
    assert torch.isinf(log_a[:, ~allowed]).all() and torch.isfinite(log_a[:, allowed]).all()
    alpha = pol.concentration(s).detach()[:, allowed].double()
    ref = torch.distributions.Dirichlet(alpha).log_prob(log_a[:, allowed].exp().double())
    ref = torch.logaddexp(ref + math.log1p(-eps), torch.full_like(ref, math.lgamma(3) + math.log(eps))) if eps else ref
    assert logp(log_a, s).double().detach() == pytest.approx(ref.tolist(), abs=1e-4)
    one = torch.tensor([False, False, True, False, False])  # one state allowed: a point mass, log 1
    assert pol.log_prob_log(_masked(pol, one, eps)[0](s, torch.Generator()), s, eps, allowed=one.expand(7, 5)).abs().max() < 1e-6
    with pytest.raises(ValueError, match="= -inf"):
        pol.log_prob_log(log_a, s, eps, allowed=torch.ones(7, 5, dtype=torch.bool))


@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_the_masked_score_has_mean_zero_and_the_full_normaliser_is_biased(one_thread, eps):
    """E[grad log pi~(a | s)] = 0 for the masked draw under its own density (REINFORCE's identity); the
    same z-test rejects a density normalised over all K states instead of the allowed ones."""
    torch.manual_seed(2)
    pol = TransitionPolicy(6, concentration=8.0)
    with torch.no_grad():
        pol.L.normal_()
    allowed = torch.tensor([True, True, False, True, False, True])
    draw, logp = _masked(pol, allowed, eps)
    s = torch.nn.functional.one_hot(torch.tensor([1]), 6).float()

    def batches(log_prob, n=40, per=500):
        g, out = torch.Generator().manual_seed(0), []
        for _ in range(n):
            ss = s.expand(per, 6)
            pol.zero_grad()
            log_prob(draw(ss, g), ss).mean().backward()
            out.append(torch.cat([pol.L.grad.flatten(), pol.log_c.grad.view(1)]).double())
        return torch.stack(out)

    z, _, _ = z_scores(batches(logp))
    assert z.abs().max() < 5.0

    def full_normaliser(log_a, ss):  # the bug a masked density invites: lgamma of the sum over all K states
        alpha = pol.concentration(ss)
        return logp(log_a, ss) + torch.lgamma(alpha.sum(-1)) - torch.lgamma(alpha[:, allowed].sum(-1))

    if eps == 0:
        zb, _, _ = z_scores(batches(full_normaliser))
        assert zb.abs().max() > 10
