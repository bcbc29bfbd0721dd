"""The ragged decode pass: the engine under the state prompt scores every token as the padded rectangle does,
while the model's linear layers see only the real slots."""
from unittest import mock

import pytest
import torch

import ctrls.generate.ragged as rg
from tests.generate.test_conditioning import PROMPTS, RAW, SCRIPTS, _head, state_prompt


def _decode(bb, scripted, ragged: bool, head=None):
    _, _, cond = state_prompt(bb, head=head)
    with mock.patch.object(rg, "supports_ragged", rg.supports_ragged if ragged else (lambda lm: False)):
        gens, logp = scripted(bb, PROMPTS, SCRIPTS, RAW, conditioning=cond)
    return [gs[0] for gs in gens], logp


@pytest.mark.parametrize("with_head", [False, True])
def test_the_ragged_pass_scores_every_token_as_the_padded_one(tiny_llama, scripted, with_head):
    """Rows opening steps (a token and 2 vectors) beside rows feeding one token, rows leaving the batch: the
    same spans and the same log P of every token (with the adapter's head too); after the prefill the MLPs
    saw one packed sequence a pass, never the rectangle."""
    bb = tiny_llama
    head = _head(bb) if with_head else None
    ref, ref_lp = _decode(bb, scripted, ragged=False, head=head)
    seen = []
    hook = bb.model.model.layers[0].mlp.register_forward_hook(lambda m, a, o: seen.append(tuple(a[0].shape[:2])))
    try:
        got, got_lp = _decode(bb, scripted, ragged=True, head=head)
    finally:
        hook.remove()
    assert [g.spans for g in got] == [g.spans for g in ref] and [g.token_ids for g in got] == [g.token_ids for g in ref]
    assert [len(r) for r in got_lp] == [9, 9, 10]
    for a, b in zip(got_lp, ref_lp):
        assert a == pytest.approx(b, abs=1e-5)
    packed = [n for b, n in seen if b == 1]  # the prefill is (prompts, width); each pass after it one sequence
    assert len(packed) >= len(seen) - 2 and any(3 < n < 3 * 3 for n in packed)  # one row's 3 slots beside others' 1


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
