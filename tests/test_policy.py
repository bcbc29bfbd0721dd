import math

import pytest
import torch

from ctrls.policy import TransitionPolicy, fit_transitions, kl_to_prior
from ctrls.sampling import seeded

TRUE = torch.tensor([[0.7, 0.1, 0.1, 0.1],
                     [0.2, 0.5, 0.2, 0.1],
                     [0.05, 0.05, 0.6, 0.3],
                     [0.25, 0.25, 0.25, 0.25]])


def markov_pairs(n=20000, seed=0, noise=0.0):
    g = torch.Generator().manual_seed(seed)
    x = [0]
    for _ in range(n):
        x.append(int(torch.multinomial(TRUE[x[-1]], 1, generator=g)))
    s = torch.nn.functional.one_hot(torch.tensor(x), 4).float()
    if noise:  # soft posteriors: mostly the true state, some mass elsewhere
        s = (1 - noise) * s + noise * torch.softmax(torch.randn(s.shape, generator=g), -1)
    return s[:-1], s[1:]


@pytest.mark.parametrize("noise", [0.0, 0.2])
def test_fit_recovers_a_known_markov_chain(noise):
    prev, nxt = markov_pairs(noise=noise)
    L, hist = fit_transitions(prev, nxt, 4, steps=200, lr=0.05)
    est = torch.softmax(L, -1)
    if noise:  # soft targets blur the chain: compare with the chain the soft pairs define
        target = torch.linalg.lstsq(prev, nxt).solution.clamp(min=0)
        target = target / target.sum(-1, keepdim=True)
        assert (est - target).abs().max() < 0.05
    else:
        assert (est - TRUE).abs().max() < 0.05
    assert hist[-1] <= hist[0] + 1e-6


def test_kl_to_prior_is_zero_only_at_the_prior():
    L = torch.randn(3, 3)
    s_prev = torch.softmax(torch.randn(5, 3), -1)
    prior = s_prev @ torch.softmax(L, -1)
    torch.testing.assert_close(kl_to_prior(prior, s_prev, L), torch.zeros(5), atol=1e-6, rtol=0)
    assert (kl_to_prior(torch.softmax(torch.randn(5, 3), -1), s_prev, L) > 0).all()


def _policy(K=3, c=6.0):
    pol = TransitionPolicy(K, concentration=c)
    with torch.no_grad():
        pol.L.copy_(torch.tensor([[0.2, 0.1, 0.4], [0.0, 0.3, 0.1], [0.5, 0.0, 0.0]])[:K, :K])
    return pol


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0])
def test_epsilon_greedy_density_integrates_to_one(eps):
    pol = _policy()
    s = torch.tensor([[0.3, 0.3, 0.4]])
    m = 600  # midpoint rule on the 2-simplex, in (a1, a2)
    g = (torch.arange(m, dtype=torch.float64) + 0.5) / m
    a1, a2 = torch.meshgrid(g, g, indexing="ij")
    inside = (a1 + a2) < 1
    a = torch.stack([a1[inside], a2[inside], 1 - a1[inside] - a2[inside]], -1).float()
    dens = pol.log_prob(a, s.expand(len(a), 3), eps).detach().double().exp()
    assert float(dens.sum() / m**2) == pytest.approx(1.0, abs=1e-2)


def test_epsilon_zero_is_the_dirichlet_and_one_is_uniform():
    pol = _policy()
    s = torch.softmax(torch.randn(6, 3), -1)
    a = torch.softmax(torch.randn(6, 3), -1)
    ref = torch.distributions.Dirichlet(pol.log_c.exp() * pol.prior(s)).log_prob(a)
    torch.testing.assert_close(pol.log_prob(a, s, 0.0), ref)
    torch.testing.assert_close(pol.log_prob(a, s, 1.0), torch.full((6,), math.lgamma(3)))


def test_sampling_mean_determinism_and_exploration():
    pol = _policy(c=50.0)
    s = torch.tensor([[1.0, 0.0, 0.0]]).expand(4000, 3)
    a = pol.sample(s, 0.0, generator=seeded(0))
    torch.testing.assert_close(a.mean(0), pol.prior(s[:1])[0], atol=0.01, rtol=0)
    assert torch.equal(a, pol.sample(s, 0.0, generator=seeded(0)))
    assert not torch.equal(a, pol.sample(s, 0.0, generator=seeded(1)))
    # with eps = 1 the draws are uniform on the simplex: mean 1/K, much wider spread
    u = pol.sample(s, 1.0, generator=seeded(0))
    torch.testing.assert_close(u.mean(0), torch.full((3,), 1 / 3), atol=0.02, rtol=0)
    assert u.std(0).min() > 3 * a.std(0).max()


def test_entropy_and_gradients():
    pol = TransitionPolicy(5)
    s = torch.softmax(torch.randn(7, 5), -1)
    torch.testing.assert_close(pol.entropy(s), torch.full((7,), math.log(5)))  # L = 0: uniform rows
    assert pol.entropy(s, kind="dirichlet").shape == (7,)
    a = pol.sample(s, 0.2, generator=seeded(3))
    (pol.log_prob(a, s, 0.2).sum() + pol.entropy(s).sum()).backward()
    assert pol.L.grad is not None and pol.log_c.grad is not None and pol.log_c.grad != 0
    with pytest.raises(ValueError):
        pol.entropy(s, kind="renyi")
