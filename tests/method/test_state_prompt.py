"""The state prompt's math: the interleaving puts each state's vectors right before its step, teacher forcing
from the prompt's KV cache equals the whole pass, the adapter's head scores each token under its step's state,
and training moves only the vectors. (Decoding under the state prompt equals teacher forcing:
``tests/generate/test_conditioning.py``.)"""
from typing import NamedTuple

import pytest
import torch

from ctrls.method.state_prompt import (
    StatePrompt,
    adapter_head,
    chain_logprob,
    interleave,
    prompt_cache,
)


def test_interleave_places_each_states_vectors_before_its_step():
    emb = torch.arange(10, dtype=torch.float)[:, None].expand(10, 3)  # token j's embedding is j
    vec = -torch.ones((2, 2, 3)) * torch.tensor([1.0, 2.0])[:, None, None]  # state t's vectors are -(t+1)
    x, where = interleave(emb, 3, [(0, 3), (4, 6)], vec)  # prompt 3, chain 7: a blank token at chain 3
    assert x[:, 0].tolist() == [0, 1, 2, -1, -1, 3, 4, 5, 6, -2, -2, 7, 8, 9]
    assert where.tolist() == [0, 1, 2, 5, 6, 7, 8, 11, 12, 13]
    with pytest.raises(ValueError, match="ordered"):
        interleave(emb, 3, [(2, 3), (0, 1)], vec)


def _head(bb, K=4, scale=0.5, seed=0):
    """The last-hidden adapter's head with a random F_u (scale 0: a fresh adapter, E' = E)."""
    from ctrls.method.adapter import StateAdapter

    torch.manual_seed(seed)
    d = bb.model.config.hidden_size
    ad = StateAdapter(d, 2 * d, rank=8)
    torch.nn.init.normal_(ad.up.weight, std=scale) if scale else None
    return adapter_head(bb.model, ad, torch.randn(K, 2 * d)), ad


SPANS = [(0, 3), (3, 6), (6, 9)]


def test_teacher_forcing_from_the_prompt_cache_equals_the_whole_pass(tiny_llama):
    bb = tiny_llama
    torch.manual_seed(0)
    sp = StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(), seed=1)
    chain = torch.randint(10, 200, (9,)).tolist()
    z = torch.nn.functional.one_hot(torch.as_tensor([2, 0, 3]), 4).float()
    with torch.no_grad():
        lp, n = chain_logprob(bb.model, [1, 5, 9, 4], chain, SPANS, z, sp)
        cached, _ = chain_logprob(bb.model, [1, 5, 9, 4], chain, SPANS, z, sp, cache=prompt_cache(bb.model, [1, 5, 9, 4]))
        ids = torch.as_tensor([[1, 5, 9, 4, *chain]])
        plain = torch.log_softmax(bb.model(input_ids=ids).logits[0, 3:-1].float(), -1).gather(1, ids[0, 4:, None]).sum()
    assert n == 9 and float(cached) == pytest.approx(float(lp), abs=1e-4)
    assert abs(float(lp) - float(plain)) > 1e-3  # the vectors reach the chain


def test_the_adapter_head_scores_each_token_under_its_steps_state(tiny_llama):
    """With the last-hidden adapter as the head a fresh adapter (F_u = 0) leaves log P as without it, a trained
    one changes it, and swapping the steps' states changes it again; from the prompt's cache it is the same."""
    bb = tiny_llama
    torch.manual_seed(0)
    sp = StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(), seed=1)
    chain, head = torch.randint(10, 200, (9,)).tolist(), _head(bb)[0]
    z = torch.nn.functional.one_hot(torch.as_tensor([2, 0, 3]), 4).float()
    with torch.no_grad():
        lp, _ = chain_logprob(bb.model, [1, 5, 9, 4], chain, SPANS, z, sp, head=head)
        cached, _ = chain_logprob(bb.model, [1, 5, 9, 4], chain, SPANS, z, sp, head=head,
                                  cache=prompt_cache(bb.model, [1, 5, 9, 4]))
        plain, _ = chain_logprob(bb.model, [1, 5, 9, 4], chain, SPANS, z, sp)
        fresh, _ = chain_logprob(bb.model, [1, 5, 9, 4], chain, SPANS, z, sp, head=_head(bb, scale=0)[0])
        swapped, _ = chain_logprob(bb.model, [1, 5, 9, 4], chain, SPANS, z.flip(0), sp, head=head)
    assert float(cached) == pytest.approx(float(lp), abs=1e-4)
    assert float(fresh) == pytest.approx(float(plain), abs=1e-5)
    assert abs(float(lp) - float(plain)) > 1e-3 and abs(float(swapped) - float(lp)) > 1e-3


def test_the_fit_trains_the_vectors_through_a_frozen_adapter(tiny_llama):
    from ctrls.method.state_prompt import Chain, fit

    bb = tiny_llama
    head, ad = _head(bb, K=3)
    before = {k: v.clone() for k, v in ad.state_dict().items()}
    chains = [Chain([1, 2, 3], [11, 12, 13, 14, 15], [(0, 2), (2, 5)], torch.as_tensor([0, 2])),
              Chain([4, 5], [16, 17, 18], [(0, 1), (1, 3)], torch.as_tensor([1, 1]))]
    for p in bb.model.parameters():
        p.requires_grad_(False)
    sp, info = fit(bb.model, chains, chains, 3, 2, lr=0.05, epochs=3, patience=3, batch=2, seed=0, head=head)
    h = [r["heldout_logp_per_token"] for r in info["history"]]
    assert max(h[1:]) > h[0]  # the fit raised log P through the adapter's head
    assert all(torch.equal(v, ad.state_dict()[k]) for k, v in before.items())  # the adapter stayed as it was


def test_the_state_changes_the_step_and_training_moves_only_the_vectors(tiny_llama):
    bb = tiny_llama
    sp = StatePrompt(3, 2, bb.model.get_input_embeddings().weight.detach(), seed=2)
    chain, spans = [11, 12, 13, 14, 15], [(0, 2), (2, 5)]
    one = torch.nn.functional.one_hot(torch.as_tensor([0, 1]), 3).float()
    other = torch.nn.functional.one_hot(torch.as_tensor([2, 2]), 3).float()
    lp, _ = chain_logprob(bb.model, [1, 2, 3], chain, spans, one, sp)
    with torch.no_grad():
        lp2, _ = chain_logprob(bb.model, [1, 2, 3], chain, spans, other, sp)
    assert float(lp) != pytest.approx(float(lp2), abs=1e-6)  # the state reaches the step
    lp.backward()
    assert sp.vectors.grad is not None and sp.vectors.grad[:2].abs().sum() > 0
    assert float(sp.vectors.grad[2].abs().sum()) == 0.0  # state 2 was not used
    assert all(p.grad is None for p in bb.model.parameters())


def test_the_fit_checkpoints_each_improving_epoch(monkeypatch):
    from ctrls.method import state_prompt
    """on_best is called at exactly the epochs whose held-out log P beats every earlier one, with those
    vectors: a fit killed later keeps its best epoch so far (--save-vectors writes it each time)."""
    target = torch.full((3, 2, 8), 0.3)

    def logp(lm, item, sp, caches, head=None):  # a stand-in log P: higher as the vectors near a target
        return -((sp.vectors - target * item.scale) ** 2).sum(), 1

    class Item(NamedTuple):  # a stand-in chain of one step token
        scale: float
        spans: list = [(0, 1)]

    monkeypatch.setattr(state_prompt, "_logp", logp)
    monkeypatch.setattr(state_prompt, "PromptCaches", lambda lm: None)

    class LM:
        def get_input_embeddings(self):
            return torch.nn.Embedding(10, 8)

    calls = []
    sp, info = state_prompt.fit(LM(), [Item(1.0), Item(1.0), Item(2.0), Item(0.5)], [Item(1.0)], 3, 2, 0.05, 6, 6, 2, 0,
                                on_best=lambda s, i: calls.append((i["kept_epoch"], s.vectors.detach().clone())))
    h = [e["heldout_logp_per_token"] for e in info["history"]]
    improving = [e for e in range(1, len(h)) if h[e] > max(h[:e])]
    assert [c[0] for c in calls] == improving and improving
    assert torch.equal(calls[-1][1], sp.vectors.detach()) and info["kept_epoch"] == improving[-1] and info["finished"]


@pytest.mark.parametrize("with_head", [False, True])
def test_the_fits_gradient_one_chain_at_a_time_equals_the_batchs_graph(tiny_llama, with_head):
    """``accumulate_gradient`` (one chain's graph at a time, to hold one chain's activations) gives the
    gradient of one graph over the batch's mean log P per token, to the bit, with and without the adapter's
    head; the chains are those of the fit (shared prompts through ``PromptCaches``, unequal lengths)."""
    from ctrls.method.state_prompt import Chain, PromptCaches, _logp, accumulate_gradient

    bb = tiny_llama
    for p in bb.model.parameters():
        p.requires_grad_(False)
    head = _head(bb, K=3)[0] if with_head else None
    g = torch.Generator().manual_seed(0)
    chains = []
    for n in (5, 9, 3, 12, 7):
        cut = int(torch.randint(1, n, (1,), generator=g))
        chains.append(Chain([1, 2, 3] if n % 2 else [4, 5], torch.randint(10, 400, (n,), generator=g).tolist(),
                            [(0, cut), (cut, n)], torch.randint(0, 3, (2,), generator=g)))
    caches = PromptCaches(bb.model)
    sp = StatePrompt(3, 2, bb.model.get_input_embeddings().weight.detach(), seed=1)
    parts = [_logp(bb.model, c, sp, caches, head) for c in chains]  # the reference: one graph, as the fit had
    (-sum(lp for lp, _ in parts) / sum(k for _, k in parts)).backward()
    want, sp.vectors.grad = sp.vectors.grad.clone(), None
    accumulate_gradient(bb.model, chains, sp, caches, head)
    assert torch.equal(sp.vectors.grad, want) and want.abs().sum() > 0
