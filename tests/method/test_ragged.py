"""The ragged decode pass: the state prompt's decode scores every token as the padded rectangle does,
while the model's linear layers see only the real slots."""
from unittest import mock

import pytest
import torch

import ctrls.method.ragged as rg
from ctrls.method.state_prompt import StatePrompt, decode_chains

NL, STOP = {7}, {8}
FORCED = [[20, 7, 21, 22, 7, 23, 24, 25, 7, 26],  # three steps
          [30, 31, 32, 33, 7, 34, 7, 35, 8, 99],  # stops at its 9th token: leaves the batch
          [7, 40, 41, 7, 42, 43, 44, 45, 46, 47]]  # a blank first line: the step goes on
STATES = [[1, 3, 0], [2, 2, 1], [0, 3, 2]]
PROMPTS = [[1, 5, 9, 4], [1, 5, 9, 4], [3, 6]]  # two rows share a prompt; the third is left-padded


def _decode(bb, ragged: bool, cache=None, head=None):
    sp = StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(), seed=4)
    rec = [[], [], []]
    with mock.patch.object(rg, "supports_ragged", rg.supports_ragged if ragged else (lambda lm: False)):
        outs = decode_chains(bb.model, PROMPTS, [lambda t, s=s: s[t] for s in STATES], sp,
                             ends_step=lambda tok, content: tok in NL and content, has_content=lambda tok: tok not in NL,
                             max_new_tokens=10, max_steps=3, sample=lambda lg: int(lg.argmax()), stop=STOP,
                             forced=FORCED, record=rec, cache=cache, head=head)
    return outs, rec


@pytest.mark.parametrize("engine_cache", [False, True])
def test_the_ragged_pass_scores_every_token_as_the_padded_one(tiny_llama, engine_cache):
    """Rows opening steps (3 slots) beside rows feeding one token, rows leaving the batch: the same spans
    and the same log P of every token, in transformers' DynamicCache and the engine's preallocated one
    (a small capacity: it grows on the way); the MLPs saw fewer rows than the rectangle has slots."""
    from ctrls.generate.kv_cache import new_cache

    bb = tiny_llama
    ref, ref_rec = _decode(bb, ragged=False)
    seen = []
    hook = bb.model.model.layers[0].mlp.register_forward_hook(lambda m, a, o: seen.append(a[0].shape[:2]))
    try:
        got, got_rec = _decode(bb, ragged=True, cache=new_cache(bb.model, 8) if engine_cache else None)
    finally:
        hook.remove()
    assert [o.spans for o in got] == [o.spans for o in ref] and [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert [len(r) for r in got_rec] == [10, 9, 10]
    for a, b in zip(got_rec, ref_rec):
        assert a == pytest.approx(b, abs=1e-5)
    packed = [n for b, n in seen[1:] if b == 1]  # after the prefill, one packed sequence a pass
    assert len(packed) == len(seen) - 1 and any(3 < n < 3 * 3 for n in packed)  # one row's 3 slots beside others' 1


def test_with_the_adapter_head_the_ragged_pass_matches_the_padded_one(tiny_llama):
    """The last-hidden adapter's head reads the packed last hidden states at each row's last slot."""
    from ctrls.method.adapter import StateAdapter
    from ctrls.method.state_prompt import adapter_head

    bb = tiny_llama
    torch.manual_seed(0)
    d = bb.model.config.hidden_size
    ad = StateAdapter(d, 2 * d, rank=8)
    torch.nn.init.normal_(ad.up.weight, std=0.5)
    head = adapter_head(bb.model, ad, torch.randn(4, 2 * d))
    (_, ref), (_, got) = _decode(bb, False, head=head), _decode(bb, True, head=head)
    for a, b in zip(got, ref):
        assert a == pytest.approx(b, abs=1e-5)


def test_the_causal_padding_mask_is_the_padded_passs():
    real = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]])  # 3 old slots, 3 new; row 0 left-padded, 1 new
    m = rg.causal_padding_mask(real, 3)
    want = torch.zeros(2, 1, 3, 6, dtype=torch.bool)
    for b in range(2):
        for i in range(3):
            for j in range(6):
                want[b, 0, i, j] = bool(real[b, j]) and j <= 3 + i
    assert torch.equal(m, want)


def test_models_the_ragged_pass_does_not_cover_stay_padded(tiny_llama, tiny_qwen2):
    cfg = tiny_llama.model.config
    assert rg.supports_ragged(tiny_llama.model) and rg.supports_ragged(tiny_qwen2.model)
    before = cfg._attn_implementation
    cfg._attn_implementation = "eager"
    try:
        assert not rg.supports_ragged(tiny_llama.model)
    finally:
        cfg._attn_implementation = before
    with mock.patch.object(cfg, "layer_types", ["sliding_attention"] * cfg.num_hidden_layers, create=True):
        assert not rg.supports_ragged(tiny_llama.model)
