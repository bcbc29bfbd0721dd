import pytest
import torch

from ctrls.adapter import StateAdapter, adapted_logits
from ctrls.elbo import elbo_loss, elbo_terms

K, k = 4, 2
SPANS = [(5, 9), (9, 15), (15, 20)]  # prompt = 5 tokens, then three steps


def _batch(bb, seed=0):
    """One trajectory in the format pretraining caches: predictors at a-1 .. b-2 for a step at [a, b)."""
    torch.manual_seed(seed)
    ids = torch.randint(5, 400, (1, 20))
    with torch.no_grad():
        h = bb.hidden_states(ids)[0]
    hidden = torch.cat([h[a - 1:b - 1] for a, b in SPANS])
    targets = torch.cat([ids[0, a:b] for a, b in SPANS])
    step_index = torch.cat([torch.full((b - a,), t) for t, (a, b) in enumerate(SPANS)])
    s_post = torch.softmax(3 * torch.randn(3, K), -1)
    s_prev = torch.cat([torch.softmax(torch.randn(1, K), -1), s_post[:-1]])
    return ids, hidden, targets, step_index, s_post, s_prev


def _adapter(bb, std=0.0):
    ad = StateAdapter(bb.hidden_size, k * bb.hidden_size, rank=8)
    if std:
        torch.nn.init.normal_(ad.up.weight, std=std)
    return ad, torch.randn(K, k * bb.hidden_size), torch.randn(K, K)


def _reference_logprob(logits, ids):
    logp = torch.log_softmax(logits[0].float(), -1)
    return torch.cat([logp[a - 1:b - 1].gather(-1, ids[0, a:b, None]).squeeze(-1) for a, b in SPANS])


def test_fresh_adapter_reconstruction_is_the_backbone_loglik(tiny_llama):
    bb = tiny_llama
    ids, hidden, targets, step_index, s_post, s_prev = _batch(bb)
    ad, C, L = _adapter(bb)
    with torch.no_grad():
        terms = elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L, chunk=4)
        ref = _reference_logprob(bb.model(input_ids=ids).logits, ids)
    torch.testing.assert_close(terms.token_logprob, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(terms.rec_per_step, torch.stack([ref[:4].sum(), ref[4:10].sum(), ref[10:].sum()]))
    assert terms.n_tokens.tolist() == [4, 6, 5]
    torch.testing.assert_close(terms.elbo, ref.sum() - terms.kl_per_step.sum())


def test_reconstruction_matches_teacher_forced_adapted_logits(tiny_qwen2):
    """A trained adapter on cached features gives the same log-likelihoods as the full adapted forward
    pass with DESIGN.md's position rule, whatever the chunking."""
    bb = tiny_qwen2
    ids, hidden, targets, step_index, s_post, s_prev = _batch(bb, seed=3)
    ad, C, L = _adapter(bb, std=0.05)
    s_pos = torch.zeros(1, ids.shape[1], K)
    for t, (a, b) in enumerate(SPANS):
        s_pos[0, a - 1:b - 1] = s_post[t]
    with torch.no_grad():
        ref = _reference_logprob(adapted_logits(bb.model, ad, ids, s_pos, C), ids)
        t3 = elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L, chunk=3)
        t_all = elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L)
    assert not torch.allclose(ref, _reference_logprob(bb.model(input_ids=ids).logits, ids))  # the adapter acts
    torch.testing.assert_close(t3.token_logprob, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(t3.token_logprob, t_all.token_logprob)


def test_gradient_equals_plain_autograd(tiny_llama):
    bb = tiny_llama
    _, hidden, targets, step_index, s_post, s_prev = _batch(bb, seed=4)
    ad, C, L = _adapter(bb, std=0.05)
    loss = elbo_loss(elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L, chunk=5))
    got = torch.autograd.grad(loss, list(ad.parameters()))
    logits = bb.lm_head(ad.forward_s(hidden, s_post[step_index], C))
    ref_loss = torch.nn.functional.cross_entropy(logits, targets)  # the KL has no adapter parameters
    ref = torch.autograd.grad(ref_loss, list(ad.parameters()))
    torch.testing.assert_close(loss, ref_loss + elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post,
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
        t0 = elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, at_prior, s_prev, L)
        t1 = elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, torch.softmax(torch.randn(3, K), -1), s_prev, L)
    assert t0.kl_per_step.abs().max() < 1e-6 and (t1.kl_per_step > 1e-3).all()


def test_adapter_training_raises_the_elbo(tiny_qwen2):
    bb = tiny_qwen2
    _, hidden, targets, step_index, s_post, s_prev = _batch(bb, seed=2)
    ad, C, L = _adapter(bb)
    opt = torch.optim.Adam(ad.parameters(), lr=1e-2)
    first = None
    for _ in range(20):
        terms = elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L)
        first = float(terms.elbo.detach()) if first is None else first
        opt.zero_grad()
        elbo_loss(terms).backward()
        opt.step()
    assert float(terms.elbo.detach()) > first + 1.0
    assert all(p.grad is None for p in bb.model.parameters())


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
            elbo_terms(**{**args, key: value})
    with pytest.raises(ValueError, match="chunk"):
        elbo_terms(**args, chunk=0)
