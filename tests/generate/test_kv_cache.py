"""ctrls.generate.kv_cache: the shared-prefix decode attention against transformers' eager attention, and
the engine's use of it (the same samples as attending over every row's whole cache)."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from ctrls.generate.sampling import SampleParams, sample


def _module(groups: int):
    return SimpleNamespace(num_key_value_groups=groups, training=False, is_causal=True)


def _sdpa_model():
    return SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"))


@pytest.mark.parametrize("groups,mask_kind", [(3, "bool"), (3, "additive"), (1, "bool"), (2, "none")])
def test_prefix_attention_equals_eager_attention(groups, mask_kind):
    """One query token per row over a cache whose first L positions are the same in every row (the prompts'
    shared prefix), then left padding (masked) and each row's own positions: the prefix read once and the
    two softmaxes merged equal transformers' eager attention (keys repeated per query head, one softmax)."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    from ctrls.generate.kv_cache import prefix_sdpa_attention, shared_prefix_attention

    g = torch.Generator().manual_seed(groups)
    b, kv, L, n, d = 4, 2, 7, 9, 8
    q = torch.randn(b, kv * groups, 1, d, generator=g)
    shared_k, shared_v = torch.randn(1, kv, L, d, generator=g), torch.randn(1, kv, L, d, generator=g)
    k = torch.cat([shared_k.expand(b, -1, -1, -1), torch.randn(b, kv, n, d, generator=g)], 2)
    v = torch.cat([shared_v.expand(b, -1, -1, -1), torch.randn(b, kv, n, d, generator=g)], 2)
    keep = torch.ones(b, 1, 1, L + n, dtype=torch.bool)
    if mask_kind != "none":
        for i, pad in enumerate((0, 2, 5, 8)):  # left padding between the prefix and each row's own tokens
            keep[i, ..., L:L + pad] = False
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    mask = {"bool": keep, "additive": additive, "none": None}[mask_kind]
    ref, _ = eager_attention_forward(_module(groups), q, k, v, additive, scaling=d ** -0.5)
    with shared_prefix_attention(_sdpa_model(), L):
        out, _ = prefix_sdpa_attention(_module(groups), q, k, v, mask, scaling=d ** -0.5)
    assert out.shape == ref.shape == (b, 1, kv * groups, d)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_prefix_attention_keeps_a_bfloat16_querys_dtype():
    """With ``backbone.dtype=auto`` a CPU may decode in bfloat16: the merged output is bfloat16 (the kernel's
    log-sum-exps are float32) and equals the packed attention within bfloat16's precision."""
    from ctrls.generate.kv_cache import packed_sdpa_attention, prefix_sdpa_attention, shared_prefix_attention

    g = torch.Generator().manual_seed(0)
    shared = torch.randn(1, 2, 6, 8, generator=g)
    q = torch.randn(3, 4, 1, 8, generator=g).bfloat16()
    k = torch.cat([shared.expand(3, -1, -1, -1), torch.randn(3, 2, 4, 8, generator=g)], 2).bfloat16()
    v = torch.cat([-shared.expand(3, -1, -1, -1), torch.randn(3, 2, 4, 8, generator=g)], 2).bfloat16()
    keep = torch.ones(3, 1, 1, 10, dtype=torch.bool)
    keep[1, ..., 6:8] = False
    with shared_prefix_attention(_sdpa_model(), 6):
        out, _ = prefix_sdpa_attention(_module(2), q, k, v, keep, scaling=8 ** -0.5)
    ref, _ = packed_sdpa_attention(_module(2), q, k, v, keep, scaling=8 ** -0.5)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=3e-2)


def test_outside_the_block_the_prefix_attention_is_the_packed_one():
    """Without a shared prefix (outside ``shared_prefix_attention``, or length 0) nothing is split, and the
    model's attention is switched only inside the block, then restored."""
    from ctrls.generate import kv_cache

    model = _sdpa_model()
    with kv_cache.shared_prefix_attention(model, 5):
        assert model.config._attn_implementation == kv_cache.PREFIX_SDPA
    assert model.config._attn_implementation == "sdpa"
    with kv_cache.shared_prefix_attention(model, 0):
        assert model.config._attn_implementation == "sdpa"
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    a, _ = kv_cache.prefix_sdpa_attention(_module(2), q, k, v, None, scaling=0.3)
    b, _ = kv_cache.packed_sdpa_attention(_module(2), q, k, v, None, scaling=0.3)
    assert torch.equal(a, b)


def test_the_engine_reads_the_shared_prefix_once_and_samples_the_same(tiny_llama, monkeypatch):
    """Prompts with a common 40-token start (a few-shot prefix): every decode step of the engine attends to
    it once for all rows (the split kernel is called), and the samples, Base and CTRLS, equal those of the
    engine attending over every row's whole cache."""
    import ctrls.generate.kv_cache as kv_cache
    import ctrls.generate.sampling as sampling
    from ctrls.generate.decoding import MIN_SHARED_PREFIX
    from tests.generate.test_sampling import random_ctrls

    tok = tiny_llama.tokenizer
    prefix = tok("Solve each problem step by step, then give the answer. " * 4)["input_ids"][:40]
    assert len(prefix) >= MIN_SHARED_PREFIX
    prompts = [prefix + tok(t)["input_ids"] for t in ("Two plus two is", "The cat sat on the mat and", "Once")]
    p = SampleParams(temperature=0.9, top_k=20, max_new_tokens=10, max_steps=4, batch_size=16, epsilon=0.3)
    model = random_ctrls(tiny_llama, K=4, trained=True, scale=0.5, seed=3)
    calls = []
    real = kv_cache._flash_cpu

    def counting(*a, **k):
        calls.append(a[1].shape[-2])  # the key length of each part
        return real(*a, **k)

    monkeypatch.setattr(kv_cache, "_flash_cpu", counting)
    split = {m: sample(tiny_llama, prompts, 3, p, model=m, seeds=[1, 2, 3]) for m in (None, model)}
    assert calls and len(prefix) in calls  # the prefix part: row 0's first 40 positions
    monkeypatch.setattr(sampling, "shared_prefix_attention", lambda lm, n: contextlib.nullcontext())
    whole = {m: sample(tiny_llama, prompts, 3, p, model=m, seeds=[1, 2, 3]) for m in (None, model)}
    for m in (None, model):
        assert [g.token_ids for gs in split[m] for g in gs] == [g.token_ids for gs in whole[m] for g in gs]
        assert sum(g.n_tokens for gs in split[m] for g in gs) > 9 * 3
    assert tiny_llama.model.config._attn_implementation == "sdpa"
