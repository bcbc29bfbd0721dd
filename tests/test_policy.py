import math

import numpy as np
import pytest
import torch

from ctrls.policy import TransitionPolicy, fit_transitions, kl_to_prior, sample_dirichlet

TRUE = torch.tensor([[0.7, 0.1, 0.1, 0.1],
                     [0.2, 0.5, 0.2, 0.1],
                     [0.05, 0.05, 0.6, 0.3],
                     [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)


@pytest.fixture
def one_thread():
    """Many tiny ops: on a busy 2-core machine, intra-op threading makes each one ~20x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def markov_chain(n=20000, seed=0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    cum, u = TRUE.cumsum(1).numpy(), rng.random(n)
    x = [0]
    for t in range(n):
        x.append(min(int(np.searchsorted(cum[x[-1]], u[t])), 3))
    return torch.tensor(x)


def test_fit_recovers_a_known_markov_chain_from_one_hot_states(one_thread):
    s = torch.nn.functional.one_hot(markov_chain(), 4).float()
    L, hist = fit_transitions(s[:-1], s[1:], 4, steps=50)
    assert (torch.softmax(L, -1) - TRUE).abs().max() < 0.05
    assert len(hist) == 51
    # the returned L is the best iterate: its KL is the history's minimum
    assert float(kl_to_prior(s[1:], s[:-1], L).mean()) == pytest.approx(min(hist), rel=1e-6)


def test_fit_recovers_the_chain_from_soft_states(one_thread):
    # every step's state distribution is soft: state j is observed as the row M[j] (mass 0.75 on j).
    # The KL fit is then exact at T = M^-1 TRUE M (M[x] T = E[s_next | x] for every x), and
    # M T M^-1 gives the true chain back.
    g = torch.Generator().manual_seed(1)
    M = 0.75 * torch.eye(4, dtype=torch.float64) + 0.25 * torch.softmax(torch.randn(4, 4, generator=g, dtype=torch.float64), -1)
    s = M[markov_chain(seed=1)].float()
    L, hist = fit_transitions(s[:-1], s[1:], 4, steps=100)
    est = torch.softmax(L.double(), -1)
    target = torch.linalg.solve(M, TRUE @ M)
    assert target.min() > 0  # a valid chain: the fit can reach it
    assert (est - target).abs().max() < 0.05
    assert (M @ est @ torch.linalg.inv(M) - TRUE).abs().max() < 0.05
    # the soft-count start alone is biased (max error ~0.14 here); the KL refinement removes that
    L0, _ = fit_transitions(s[:-1], s[1:], 4, steps=0)
    assert (torch.softmax(L0.double(), -1) - target).abs().max() > 0.1 and hist[-1] < hist[0]


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


def test_log_prob_is_finite_on_the_simplex_boundary():
    pol = TransitionPolicy(4, concentration=0.5)  # c p < 1: the density diverges at the boundary
    a = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    assert torch.isfinite(pol.log_prob(a, torch.full((2, 4), 0.25), 0.1)).all()


def test_dirichlet_sampler_matches_the_moments(one_thread):
    alpha = torch.tensor([0.3, 1.0, 2.5, 8.0])  # below and above 1: both branches of the sampler
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
