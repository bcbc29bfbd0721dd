"""The state prompt: teacher forcing equals decoding with the KV cache (the same sequence, positions
included), the interleaving puts each state's vectors right before its step, and training moves only
the vectors."""
from typing import NamedTuple

import pytest
import torch

from ctrls.method.state_prompt import (
    StatePrompt,
    adapter_head,
    chain_logprob,
    decode_chain,
    decode_chains,
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


def _decode(bb, sp, forced, states, record=None, max_steps=3, head=None):
    nl = {int(forced[2]), int(forced[5])}  # two tokens of the chain act as newlines
    return decode_chain(bb.model, [1, 5, 9, 4], lambda t: states[t], sp,
                        ends_step=lambda tok, content: tok in nl and content, has_content=lambda tok: tok not in nl,
                        max_new_tokens=len(forced), max_steps=max_steps, sample=lambda lg: int(lg.argmax()), stop=set(),
                        forced=forced, record=record, head=head)


def _head(bb, K=4, scale=0.5, seed=0):
    """The last-hidden adapter's head with a random F_u (scale 0: a fresh adapter, E' = E)."""
    from ctrls.method.adapter import StateAdapter

    torch.manual_seed(seed)
    d = bb.model.config.hidden_size
    ad = StateAdapter(d, 2 * d, rank=8)
    torch.nn.init.normal_(ad.up.weight, std=scale) if scale else None
    return adapter_head(bb.model, ad, torch.randn(K, 2 * d)), ad


@pytest.mark.parametrize("max_steps", [3, 2])
def test_teacher_forcing_equals_decoding_with_the_cache(tiny_llama, max_steps):
    bb = tiny_llama
    torch.manual_seed(0)
    sp = StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(), seed=1)
    forced = torch.randint(10, 200, (9,)).tolist()
    states = [2, 0, 3]
    rec = []
    d = _decode(bb, sp, forced, states, rec, max_steps)
    assert d.token_ids == forced and d.states == states[:max_steps]
    assert d.spans == [(0, 3), (3, 6), (6, 9)][:max_steps] if max_steps == 3 else d.spans == [(0, 3), (3, 6)]
    z = torch.nn.functional.one_hot(torch.as_tensor(d.states), 4).float()
    with torch.no_grad():
        lp, n = chain_logprob(bb.model, [1, 5, 9, 4], forced, d.spans, z, sp)
    want = sum(rec[i] for a, b in d.spans for i in range(a, b))
    assert n == sum(b - a for a, b in d.spans)
    assert float(lp) == pytest.approx(want, abs=1e-4)
    with torch.no_grad():  # the prompt from its cache: the same sequence, the same positions
        lp_cached, _ = chain_logprob(bb.model, [1, 5, 9, 4], forced, d.spans, z, sp, cache=prompt_cache(bb.model, [1, 5, 9, 4]))
    assert float(lp_cached) == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("max_steps", [3, 2])
def test_with_the_adapter_teacher_forcing_equals_decoding(tiny_llama, max_steps):
    """With the last-hidden adapter as the head, each token is scored under its own step's state in both
    passes; a fresh adapter (F_u = 0) leaves log P as without it, a trained one changes it."""
    bb = tiny_llama
    torch.manual_seed(0)
    sp = StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(), seed=1)
    forced, states, head = torch.randint(10, 200, (9,)).tolist(), [2, 0, 3], _head(bb)[0]
    rec = []
    d = _decode(bb, sp, forced, states, rec, max_steps, head=head)
    z = torch.nn.functional.one_hot(torch.as_tensor(d.states), 4).float()
    want = sum(rec[i] for a, b in d.spans for i in range(a, b))
    with torch.no_grad():
        lp, _ = chain_logprob(bb.model, [1, 5, 9, 4], forced, d.spans, z, sp, head=head)
        cached, _ = chain_logprob(bb.model, [1, 5, 9, 4], forced, d.spans, z, sp, head=head,
                                  cache=prompt_cache(bb.model, [1, 5, 9, 4]))
        plain, _ = chain_logprob(bb.model, [1, 5, 9, 4], forced, d.spans, z, sp)
        fresh, _ = chain_logprob(bb.model, [1, 5, 9, 4], forced, d.spans, z, sp, head=_head(bb, scale=0)[0])
        swapped, _ = chain_logprob(bb.model, [1, 5, 9, 4], forced, d.spans, z.flip(0), sp, head=head)
    assert float(lp) == pytest.approx(want, abs=1e-4) and float(cached) == pytest.approx(want, abs=1e-4)
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


@pytest.mark.parametrize("prompts", [[[1, 5, 9, 4], [1, 5, 9, 4], [3, 6]], [[1, 5, 9, 4], [1, 5, 9, 4], [1, 5, 2]]])
def test_chains_decoded_side_by_side_equal_each_chain_teacher_forced(tiny_llama, prompts):
    """Rows of different prompts (left padding; in the second case after their shared prefix [1, 5], run
    once) open their steps at different tokens (padding in between), stop early, or run out of steps:
    each row's log P per token equals its own teacher-forced sequence, positions included."""
    bb = tiny_llama
    torch.manual_seed(3)
    sp = StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(), seed=4)
    nl, stop = {7}, {8}
    forced = [[20, 7, 21, 22, 7, 23, 24, 25, 7, 26],  # three steps
              [30, 31, 32, 33, 7, 34, 7, 35, 8, 99],  # three steps, stops at its 9th token
              [7, 40, 41, 7, 42, 43, 44, 45, 46, 47]]  # a blank first line: the step goes on
    states = [[1, 3, 0], [2, 2, 1], [0, 3, 2]]
    rec = [[], [], []]
    outs = decode_chains(bb.model, prompts, [lambda t, s=s: s[t] for s in states], sp,
                         ends_step=lambda tok, content: tok in nl and content, has_content=lambda tok: tok not in nl,
                         max_new_tokens=10, max_steps=3, sample=lambda lg: int(lg.argmax()), stop=stop,
                         forced=forced, record=rec)
    assert outs[1].token_ids == forced[1][:8] and len(rec[1]) == 9  # the stop token is scored, not kept
    assert [o.spans for o in outs] == [[(0, 2), (2, 5), (5, 9)], [(0, 5), (5, 7), (7, 8)], [(0, 4), (4, 10)]]
    for r, d in enumerate(outs):
        z = torch.nn.functional.one_hot(torch.as_tensor(d.states[:len(d.spans)]), 4).float()
        with torch.no_grad():
            lp, n = chain_logprob(bb.model, prompts[r], d.token_ids, d.spans, z, sp)
        assert float(lp) == pytest.approx(sum(rec[r][i] for a, b in d.spans for i in range(a, b)), abs=1e-4)
        single = []  # one row alone decodes the same
        decode_chain(bb.model, prompts[r], lambda t, r=r: states[r][t], sp, ends_step=lambda tok, c: tok in nl and c,
                     has_content=lambda tok: tok not in nl, max_new_tokens=10, max_steps=3,
                     sample=lambda lg: int(lg.argmax()), stop=stop, forced=forced[r], record=single)
        assert single == pytest.approx(rec[r], abs=1e-4)


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


def test_closes_chain_ends_a_row_at_its_step_and_feeds_nothing_after(tiny_llama):
    """The sampler's rules through ``closes_chain``: the row whose second step closes with a reason ends
    there (its closing token kept, nothing decoded or scored after it, the reason recorded); its
    batch-mate goes on, and still equals its own teacher-forced sequence."""
    bb = tiny_llama
    sp = StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(), seed=2)
    nl = {7}
    forced = [[20, 7, 21, 22, 7, 23, 24, 7, 25, 26], [30, 7, 31, 7, 32, 33, 34, 7, 35, 36]]
    states = [[1, 2, 3, 0], [0, 1, 2, 3]]
    rec, seen = [[], []], []

    def closes(step, n):  # row 0's second step holds token 22: "the answer line"
        seen.append((list(step), n))
        return "answer" if 22 in step else None

    outs = decode_chains(bb.model, [[1, 5, 9, 4], [3, 6]], [lambda t, s=s: s[t] for s in states], sp,
                         ends_step=lambda tok, c: tok in nl and c, has_content=lambda tok: tok not in nl,
                         max_new_tokens=10, max_steps=4, sample=[lambda lg: 0, lambda lg: 0], stop={8},
                         forced=forced, record=rec, closes_chain=closes)
    assert outs[0].token_ids == forced[0][:5] and outs[0].finish == "answer" and len(rec[0]) == 5
    assert outs[0].spans == [(0, 2), (2, 5)] and outs[0].states == [1, 2]  # no state drawn after the last step
    assert ([21, 22, 7], 2) in seen and outs[1].finish == "max_tokens" and outs[1].token_ids == forced[1]
    z = torch.nn.functional.one_hot(torch.as_tensor(outs[1].states[:len(outs[1].spans)]), 4).float()
    with torch.no_grad():
        lp, _ = chain_logprob(bb.model, [3, 6], outs[1].token_ids, outs[1].spans, z, sp)
    assert float(lp) == pytest.approx(sum(rec[1][i] for a, b in outs[1].spans for i in range(a, b)), abs=1e-4)
    with pytest.raises(ValueError, match="3 samplers for 2 rows"):
        decode_chains(bb.model, [[1, 5], [3, 6]], [lambda t: 0] * 2, sp, ends_step=lambda tok, c: False,
                      has_content=lambda tok: True, max_new_tokens=2, max_steps=1, sample=[lambda lg: 0] * 3, stop=set())


def test_each_row_draws_with_its_own_sampler(tiny_llama):
    """``sample`` as one callable per row: row r's tokens are its sampler's choices."""
    bb = tiny_llama
    sp = StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(), seed=2)
    outs = decode_chains(bb.model, [[1, 5, 9], [1, 5, 9]], [lambda t: 0] * 2, sp, ends_step=lambda tok, c: False,
                         has_content=lambda tok: True, max_new_tokens=4, max_steps=1,
                         sample=[lambda lg: 11, lambda lg: int(lg.argmax())], stop=set())
    assert outs[0].token_ids == [11] * 4 and outs[1].token_ids != [11] * 4


def test_the_engines_cache_and_packed_attention_decode_the_same_chains(tiny_llama):
    """``cache=new_cache(...)`` under ``packed_decode_attention(model, PACKED_SDPA_ROWS)`` (what the stage
    passes: a preallocated cache, attention on the KV heads for one or several query tokens a row; the
    tiny model has 4 heads on 2 KV heads) scores every token as transformers' DynamicCache and SDPA do,
    rows opening steps (3 slots) beside rows feeding one token, and rows leaving the batch, included."""
    from ctrls.generate.kv_cache import PACKED_SDPA_ROWS, new_cache, packed_decode_attention

    bb = tiny_llama
    sp = StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(), seed=4)
    nl = {7}
    forced = [[20, 7, 21, 22, 7, 23, 24, 25, 7, 26], [30, 31, 32, 33, 7, 34, 7, 35, 8, 99], [7, 40, 41, 7, 42, 43, 44, 45, 46, 47]]
    states = [[1, 3, 0], [2, 2, 1], [0, 3, 2]]
    prompts = [[1, 5, 9, 4], [1, 5, 9, 4], [3, 6]]

    def run(**kw):
        rec = [[], [], []]
        outs = decode_chains(bb.model, prompts, [lambda t, s=s: s[t] for s in states], sp,
                             ends_step=lambda tok, content: tok in nl and content, has_content=lambda tok: tok not in nl,
                             max_new_tokens=10, max_steps=3, sample=lambda lg: int(lg.argmax()), stop={8},
                             forced=forced, record=rec, **kw)
        return outs, rec

    ref, ref_rec = run()
    calls = []
    import ctrls.generate.kv_cache as kvc

    real = kvc.torch.nn.functional.scaled_dot_product_attention

    def spy(q, *a, **k):  # the packed path ran, with several query tokens a row on some passes
        calls.append(q.shape[2])
        return real(q, *a, **k)

    with packed_decode_attention(bb.model, PACKED_SDPA_ROWS):
        kvc.torch.nn.functional.scaled_dot_product_attention = spy
        try:
            got, got_rec = run(cache=new_cache(bb.model, 8))
        finally:
            kvc.torch.nn.functional.scaled_dot_product_attention = real
    assert bb.model.config._attn_implementation == "sdpa" and {2, 6} <= set(calls)  # 2 KV-head groups x 1 or 3 slots  # a small capacity: the buffer grows on the way
    assert [o.spans for o in got] == [o.spans for o in ref] and [len(r) for r in got_rec] == [10, 9, 10]
    for a, b in zip(got_rec, ref_rec):
        assert a == pytest.approx(b, abs=1e-5)


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
