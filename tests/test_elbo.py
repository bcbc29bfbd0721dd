import torch

from ctrls.adapter import StateAdapter
from ctrls.elbo import elbo_loss, elbo_terms

K, k = 4, 2


def _batch(bb, seed=0):
    torch.manual_seed(seed)
    ids = torch.randint(5, 400, (1, 20))
    with torch.no_grad():
        h = bb.hidden_states(ids)[0]
    # prompt = 5 tokens; steps at [5, 9), [9, 15), [15, 20): predictors at a-1 .. b-2
    spans = [(5, 9), (9, 15), (15, 20)]
    hidden = torch.cat([h[a - 1:b - 1] for a, b in spans])
    targets = torch.cat([ids[0, a:b] for a, b in spans])
    step_index = torch.cat([torch.full((b - a,), t) for t, (a, b) in enumerate(spans)])
    s_post = torch.softmax(3 * torch.randn(3, K), -1)
    s_prev = torch.cat([torch.softmax(torch.randn(1, K), -1), s_post[:-1]])
    return ids, h, hidden, targets, step_index, s_post, s_prev, spans


def test_fresh_adapter_reconstruction_is_the_backbone_loglik(tiny_llama):
    bb = tiny_llama
    ids, h, hidden, targets, step_index, s_post, s_prev, spans = _batch(bb)
    ad = StateAdapter(bb.hidden_size, k * bb.hidden_size, rank=8)
    C, L = torch.randn(K, k * bb.hidden_size), torch.randn(K, K)
    with torch.no_grad():
        terms = elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L, chunk=4)
        logp = torch.log_softmax(bb.model(input_ids=ids).logits[0].float(), -1)
    ref = torch.cat([logp[a - 1:b - 1].gather(-1, ids[0, a:b, None]).squeeze(-1) for a, b in spans])
    torch.testing.assert_close(terms.token_logprob, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(terms.rec_per_step, torch.stack([ref[:4].sum(), ref[4:10].sum(), ref[10:].sum()]))
    assert terms.n_tokens.tolist() == [4, 6, 5]


def test_kl_term_vanishes_at_the_prior(tiny_llama):
    bb = tiny_llama
    _, _, hidden, targets, step_index, _, s_prev, _ = _batch(bb, seed=1)
    L = torch.randn(K, K)
    ad = StateAdapter(bb.hidden_size, k * bb.hidden_size, rank=8)
    C = torch.randn(K, k * bb.hidden_size)
    at_prior = s_prev @ torch.softmax(L, -1)
    with torch.no_grad():
        t0 = elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, at_prior, s_prev, L)
        t1 = elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, torch.softmax(torch.randn(3, K), -1), s_prev, L)
    assert t0.kl_per_step.abs().max() < 1e-6 and (t1.kl_per_step > 0).all()


def test_adapter_training_raises_the_elbo(tiny_qwen2):
    bb = tiny_qwen2
    _, _, hidden, targets, step_index, s_post, s_prev, _ = _batch(bb, seed=2)
    ad = StateAdapter(bb.hidden_size, k * bb.hidden_size, rank=8)
    C, L = torch.randn(K, k * bb.hidden_size), torch.randn(K, K)
    opt = torch.optim.Adam(ad.parameters(), lr=1e-2)
    first = None
    for _ in range(20):
        terms = elbo_terms(ad, bb.lm_head, C, hidden, targets, step_index, s_post, s_prev, L)
        first = float(terms.elbo) if first is None else first
        opt.zero_grad()
        elbo_loss(terms).backward()
        opt.step()
    assert float(terms.elbo) > first + 1.0
