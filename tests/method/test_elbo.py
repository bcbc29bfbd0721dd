"""ctrls.method.elbo: Thm. 5.3's bound equals its enumeration over z and bounds a known chain's likelihood, the
expected KL is at least the mixture-prior KL, and the relaxed objective's reconstruction, gradient and KL agree
with full adapted forwards and plain autograd; bad inputs are refused naming the problem."""
import itertools
import math

import pytest
import torch

from ctrls.method.adapter import StateAdapter, adapted_logits
from ctrls.method.elbo import elbo, elbo_from_logliks, expected_kl, relaxed_loss, relaxed_terms, state_token_logprobs
from ctrls.method.policy import kl_to_prior

K, k = 4, 2
SPANS = [(5, 9), (9, 15), (15, 20)]  # prompt = 5 tokens, then three steps


@pytest.fixture(scope="module")
def small_llama():
    """A tiny random-weight Llama with a 512-token vocabulary: the enumeration tests run many forwards."""
    from ctrls.method.backbone import tiny_backbone

    return tiny_backbone("llama", None, seed=3, vocab_size=512)


@pytest.fixture(scope="module")
def small_qwen2():
    from ctrls.method.backbone import tiny_backbone

    return tiny_backbone("qwen2", None, seed=4, vocab_size=512)


def _batch(bb, seed=0, n_states=K):
    """One trajectory in the format pretraining caches: predictors at a-1 .. b-2 for a step at [a, b)."""
    torch.manual_seed(seed)
    ids = torch.randint(5, 400, (1, 20))
    with torch.no_grad():
        h = bb.hidden_states(ids)[0]
    hidden = torch.cat([h[a - 1:b - 1] for a, b in SPANS])
    targets = torch.cat([ids[0, a:b] for a, b in SPANS])
    step_index = torch.cat([torch.full((b - a,), t) for t, (a, b) in enumerate(SPANS)])
    s_post = torch.softmax(3 * torch.randn(3, n_states), -1)
    s_prev = torch.cat([torch.softmax(torch.randn(1, n_states), -1), s_post[:-1]])
    return ids, hidden, targets, step_index, s_post, s_prev


def _adapter(bb, std=0.0, n_states=K, fusion="linear"):
    ad = StateAdapter(bb.hidden_size, k * bb.hidden_size, rank=8, fusion=fusion)
    if std:
        torch.nn.init.normal_(ad.up.weight, std=std)
        torch.nn.init.normal_(ad.up.bias, std=std)
    return ad, torch.randn(n_states, k * bb.hidden_size), torch.randn(n_states, n_states)


def _reference_logprob(logits, ids):
    logp = torch.log_softmax(logits[0].double(), -1)
    return torch.cat([logp[a - 1:b - 1].gather(-1, ids[0, a:b, None]).squeeze(-1) for a, b in SPANS])


def _states_at_positions(ids, states):
    """(1, S, K) with the state of step t at its predictor positions a-1 .. b-2 (the position rule of book/design.md)."""
    s_pos = torch.full((1, ids.shape[1], states.shape[1]), 1.0 / states.shape[1])
    for t, (a, b) in enumerate(SPANS):
        s_pos[0, a - 1:b - 1] = states[t]
    return s_pos


# ---- Thm. 5.3: the bound ------------------------------------------------------------------------


@pytest.mark.parametrize("fusion", ["linear", "mlp"])
def test_state_logprobs_equal_K_full_adapted_forward_passes(small_qwen2, fusion):
    """The one-pass exact reconstruction equals K teacher-forced forwards of backbone + adapter
    with z = gamma_j at every step, and the mean-z column equals the forward at z = s_t Gamma."""
    bb = small_qwen2
    ids, hidden, targets, step_index, s_post, _ = _batch(bb, seed=5)
    ad, C, _ = _adapter(bb, std=0.05 if fusion == "linear" else 0.3, fusion=fusion)
    with torch.no_grad():
        lp, lp_bar = state_token_logprobs(ad, bb.lm_head, C, hidden, targets, step_index, s_post, chunk=6)
        ref = torch.stack([_reference_logprob(adapted_logits(bb.model, ad, ids, torch.eye(K)[j].expand(1, 20, K), C),
                                              ids) for j in range(K)], 1)
        ref_bar = _reference_logprob(adapted_logits(bb.model, ad, ids, _states_at_positions(ids, s_post), C), ids)
    assert (ref[:, 1:] - ref[:, :1]).abs().max() > 1e-2  # the states change the likelihood
    torch.testing.assert_close(lp, ref, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(lp_bar, ref_bar, atol=1e-4, rtol=1e-5)


def test_elbo_equals_the_enumerated_sum_over_z(small_llama):
    """Thm. 5.3's bound equals E_Q[log P(x, z) - log Q(z)] summed by hand over every z_{0:T}, with
    P(x | z) from full adapted forward passes (one per z_{1:T}) and P(z) = s_0(z_0) prod_t softmax(L)."""
    bb = small_llama
    n = 3
    ids, hidden, targets, step_index, s_post, s_prev = _batch(bb, seed=6, n_states=n)
    ad, C, L = _adapter(bb, std=0.05, n_states=n)
    log_A = torch.log_softmax(L.double(), -1)
    s0 = s_prev[0].double()
    brute = 0.0
    with torch.no_grad():
        for z in itertools.product(range(n), repeat=len(SPANS)):  # z_1 .. z_T
            lp = _reference_logprob(adapted_logits(bb.model, ad, ids, _states_at_positions(ids, torch.eye(n)[list(z)]),
                                                   C), ids)
            log_px_given_z = float(lp.sum())
            for z0 in range(n):
                path = (z0, *z)
                log_q = math.log(s0[z0]) + sum(math.log(s_post[t, zt]) for t, zt in enumerate(z))
                log_pz = math.log(s0[z0]) + sum(float(log_A[path[t], path[t + 1]]) for t in range(len(z)))
                brute += math.exp(log_q) * (log_px_given_z + log_pz - log_q)
        got = elbo(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L)
        mc = elbo(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L, samples=200,
                  generator=torch.Generator().manual_seed(0))
    assert got.stderr == 0 and got.n_tokens.tolist() == [4, 6, 5]
    assert float(got.value) == pytest.approx(brute, abs=1e-3)
    assert 0 < mc.stderr < 1 and abs(float(mc.value) - brute) < 4 * mc.stderr  # Monte Carlo, within its error


def _forward_loglik(log_e: torch.Tensor, s0: torch.Tensor, log_A: torch.Tensor) -> float:
    """log P(x_{1:T}) = log sum_z s_0(z_0) prod_t A(z_{t-1}, z_t) P(x_t | z_t) (the forward algorithm)."""
    log_alpha = s0.log()
    for t in range(len(log_e)):
        log_alpha = torch.logsumexp(log_alpha[:, None] + log_A, 0) + log_e[t]
    return float(torch.logsumexp(log_alpha, 0))


def _posterior_kl(q: torch.Tensor, s0: torch.Tensor, log_A: torch.Tensor, log_e: torch.Tensor) -> float:
    """KL(Q(z_{0:T}) || P(z_{0:T} | x)) by enumerating every path, Q = s_0 x prod_t q_t."""
    T, n = q.shape
    p = torch.tensor(list(itertools.product(range(n), repeat=T + 1)))  # (n^(T+1), T+1) paths z_0 .. z_T
    t = torch.arange(T)
    log_joint = s0.log()[p[:, 0]] + (log_A[p[:, :-1], p[:, 1:]] + log_e[t, p[:, 1:]]).sum(1)
    log_post = log_joint - torch.logsumexp(log_joint, 0)
    log_q = s0.log()[p[:, 0]] + q.log()[t, p[:, 1:]].sum(1)
    return float((log_q.exp() * (log_q - log_post)).sum())


def test_elbo_bounds_the_likelihood_of_a_known_chain():
    """On a 3-state chain with known emissions: ELBO <= log P(x), the gap is KL(Q || posterior)
    (enumerated), and equality holds when Q is the true posterior."""
    g = torch.Generator().manual_seed(0)
    n, T = 3, 4
    s0 = torch.softmax(torch.randn(n, generator=g, dtype=torch.float64), 0)
    L = 2 * torch.randn(n, n, generator=g, dtype=torch.float64)
    log_A = torch.log_softmax(L, -1)
    log_e = -3 * torch.rand(T, n, generator=g, dtype=torch.float64)  # log P(x_t | z_t = j)
    log_px = _forward_loglik(log_e, s0, log_A)
    for _ in range(50):
        q = torch.softmax(2 * torch.randn(T, n, generator=g, dtype=torch.float64), -1)
        b = elbo_from_logliks(log_e, q, torch.cat([s0[None], q[:-1]]), L)
        assert float(b.value) <= log_px
        assert log_px - float(b.value) == pytest.approx(_posterior_kl(q, s0, log_A, log_e), abs=1e-10)
    # transitions that ignore z_{t-1}: the true posterior factorises over t, so Q can equal it
    L_flat = L[0].expand(n, n)
    log_A_flat = torch.log_softmax(L_flat, -1)
    post = torch.softmax(log_A_flat[0] + log_e, -1)  # P(z_t | x) = A_j P(x_t | j) / sum
    exact = elbo_from_logliks(log_e, post, torch.cat([s0[None], post[:-1]]), L_flat)
    assert float(exact.value) == pytest.approx(_forward_loglik(log_e, s0, log_A_flat), abs=1e-12)
    worse = elbo_from_logliks(log_e, torch.softmax(log_e, -1), torch.cat([s0[None], post[:-1]]), L_flat)
    assert float(worse.value) < float(exact.value) - 1e-3


def test_expected_kl_is_at_least_the_mixture_prior_kl():
    """Convexity: sum_i s_{t-1,i} KL(s_t || A_i) >= KL(s_t || s_{t-1} A), equal for a one-hot s_{t-1}."""
    A = torch.tensor([[0.9, 0.1], [0.1, 0.9]], dtype=torch.float64)
    L = A.log()
    s_post, s_prev = torch.tensor([[0.9, 0.1]], dtype=torch.float64), torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    mix = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)  # the prior is (0.5, 0.5)
    expd = 0.5 * 0 + 0.5 * (0.9 * math.log(0.9 / 0.1) + 0.1 * math.log(0.1 / 0.9))
    assert float(kl_to_prior(s_post, s_prev, L)[0]) == pytest.approx(mix, abs=1e-9)
    assert float(expected_kl(s_post, s_prev, L)[0]) == pytest.approx(expd, abs=1e-12)
    assert expd > mix + 0.5
    g = torch.Generator().manual_seed(1)
    s_post = torch.softmax(2 * torch.randn(200, 5, generator=g, dtype=torch.float64), -1)
    s_prev = torch.softmax(2 * torch.randn(200, 5, generator=g, dtype=torch.float64), -1)
    L = torch.randn(5, 5, generator=g, dtype=torch.float64)
    assert (expected_kl(s_post, s_prev, L) >= kl_to_prior(s_post, s_prev, L) - 1e-12).all()
    one_hot = torch.eye(5, dtype=torch.float64)[torch.randint(0, 5, (200,), generator=g)]
    torch.testing.assert_close(expected_kl(s_post, one_hot, L), kl_to_prior(s_post, one_hot, L))


def test_elbo_bad_inputs_name_the_problem(tiny_llama):
    bb = tiny_llama
    _, hidden, targets, step_index, s_post, s_prev = _batch(bb)
    ad, C, L = _adapter(bb)
    with pytest.raises(ValueError, match="samples must be 0"):
        elbo(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L, samples=1)
    with pytest.raises(ValueError, match="step_index must lie in"):
        elbo(ad, bb.lm_head, C, hidden, targets, step_index + 1, s_post, s_prev, L)
    with pytest.raises(ValueError, match="loglik, s_post and s_prev"):
        elbo_from_logliks(torch.zeros(3, K + 1), s_post, s_prev, L)


# ---- the relaxed objective (training) -----------------------------------------------------------


def test_fresh_adapter_reconstruction_is_the_backbone_loglik(tiny_llama):
    bb = tiny_llama
    ids, hidden, targets, step_index, s_post, s_prev = _batch(bb)
    ad, C, L = _adapter(bb)
    with torch.no_grad():
        terms = relaxed_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L, chunk=4)
        ref = _reference_logprob(bb.model(input_ids=ids).logits, ids).float()
        bound = elbo(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L)
    torch.testing.assert_close(terms.token_logprob, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(terms.rec_per_step, torch.stack([ref[:4].sum(), ref[4:10].sum(), ref[10:].sum()]))
    assert terms.n_tokens.tolist() == [4, 6, 5]
    torch.testing.assert_close(terms.objective, ref.sum() - terms.kl_per_step.sum())
    # a fresh adapter ignores z: the bound's reconstruction is the backbone's too
    torch.testing.assert_close(bound.rec_per_step.float(), terms.rec_per_step, atol=1e-4, rtol=1e-5)


def test_reconstruction_matches_teacher_forced_adapted_logits(tiny_qwen2):
    """A trained adapter on cached features gives the same log-likelihoods as the full adapted forward
    pass with the position rule of book/design.md, whatever the chunking."""
    bb = tiny_qwen2
    ids, hidden, targets, step_index, s_post, s_prev = _batch(bb, seed=3)
    ad, C, L = _adapter(bb, std=0.05)
    with torch.no_grad():
        ref = _reference_logprob(adapted_logits(bb.model, ad, ids, _states_at_positions(ids, s_post), C), ids).float()
        t3 = relaxed_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L, chunk=3)
        t_all = relaxed_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L)
    assert not torch.allclose(ref, _reference_logprob(bb.model(input_ids=ids).logits, ids).float())  # the adapter acts
    torch.testing.assert_close(t3.token_logprob, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(t3.token_logprob, t_all.token_logprob)


def test_gradient_equals_plain_autograd(tiny_llama):
    bb = tiny_llama
    _, hidden, targets, step_index, s_post, s_prev = _batch(bb, seed=4)
    ad, C, L = _adapter(bb, std=0.05)
    loss = relaxed_loss(relaxed_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L, chunk=5))
    got = torch.autograd.grad(loss, list(ad.parameters()))
    logits = bb.lm_head(ad.forward_s(hidden, s_post[step_index], C))
    ref_loss = torch.nn.functional.cross_entropy(logits, targets)  # the KL has no adapter parameters
    ref = torch.autograd.grad(ref_loss, list(ad.parameters()))
    torch.testing.assert_close(loss, ref_loss + relaxed_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post,
                                                              s_prev, L).kl_per_step.sum().detach() / len(targets))
    for g, r in zip(got, ref):
        assert r.abs().max() > 0
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-4)


def test_kl_term_vanishes_at_the_prior(tiny_llama):
    bb = tiny_llama
    _, hidden, targets, step_index, _, s_prev = _batch(bb, seed=1)
    ad, C, L = _adapter(bb)
    at_prior = s_prev @ torch.softmax(L, -1)
    with torch.no_grad():
        t0 = relaxed_terms(ad, bb.lm_head, C, hidden, targets, step_index, at_prior, s_prev, L)
        t1 = relaxed_terms(ad, bb.lm_head, C, hidden, targets, step_index, torch.softmax(torch.randn(3, K), -1), s_prev, L)
    assert t0.kl_per_step.abs().max() < 1e-6 and (t1.kl_per_step > 1e-3).all()


def test_bad_inputs_name_the_problem(tiny_llama):
    bb = tiny_llama
    _, hidden, targets, step_index, s_post, s_prev = _batch(bb)
    ad, C, L = _adapter(bb)
    args = dict(adapter=ad, lm_head=bb.lm_head, centroids=C, hidden=hidden, targets=targets, step_index=step_index,
                s_post=s_post, s_prev=s_prev, L=L)
    for key, value, match in [("step_index", step_index + 1, "step_index must lie in"),
                              ("step_index", step_index.int(), "step_index must be a LongTensor"),
                              ("targets", targets[:-1], "targets must be"),
                              ("targets", targets + 10**6, "vocabulary"),
                              ("s_prev", s_prev[:2], "s_post and s_prev"),
                              ("L", torch.zeros(K + 1, K + 1), "K = 4"),
                              ("hidden", hidden[:, :-1], "hidden must be")]:
        with pytest.raises(ValueError, match=match):
            relaxed_terms(**{**args, key: value})
    with pytest.raises(ValueError, match="chunk"):
        relaxed_terms(**args, chunk=0)
