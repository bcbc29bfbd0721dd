"""The static-shape decode path (``SampleParams.decode="static"``) against the engine: the same samples,
token for token (states, log-actions, spans and finish reasons too), with rows ending at different
times (bucket moves), per-row policies and epsilon (lockstep RL), the fixed-s0 ablation, compiled,
and on the embedded backbone. Each comparison fails when the static path is broken once (a mask
column not switched on, a bucket move that takes the wrong rows, a state redraw in the wrong slot)."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from ctrls.generate.sampling import SampleParams, sample
from ctrls.method.policy import TransitionPolicy
from tests.generate.test_sampling import _frequent_boundaries, _prompts, random_ctrls

ENDING = SampleParams(temperature=1.0, top_k=0, max_new_tokens=24, max_steps=10_000, stop_at_answer=False)


def _both(bb, prompts, n, params, **kw):
    engine = sample(bb, prompts, n, replace(params, decode="engine", compile="none"), **kw)
    static = sample(bb, prompts, n, replace(params, decode="static"), **kw)
    return engine, static


def _assert_same(engine, static, states=True):
    flat_e = [g for gs in engine for g in gs]
    flat_s = [g for gs in static for g in gs]
    assert [(g.prompt_index, g.sample_index) for g in flat_e] == [(g.prompt_index, g.sample_index) for g in flat_s]
    for e, s in zip(flat_e, flat_s):
        assert s.token_ids == e.token_ids
        assert (s.finish, s.spans) == (e.finish, e.spans)
        if states and e.states is not None:
            torch.testing.assert_close(s.states, e.states, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(s.log_actions, e.log_actions, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(s.policy_states, e.policy_states, rtol=1e-5, atol=1e-6)


def _many_eos(bb, monkeypatch):
    """Make every 10th token id an EOS, so rows of a tiny random model end at different times."""
    monkeypatch.setattr(bb.model.generation_config, "eos_token_id", list(range(0, 49152, 10)))


def _count_bucket_moves(monkeypatch):
    import ctrls.generate.static_decode as S

    moves = []
    orig = S.select_rows
    monkeypatch.setattr(S, "select_rows", lambda cache, config, idx, length: (moves.append(len(idx)),
                                                                             orig(cache, config, idx, length))[1])
    return moves


def test_static_equals_engine_while_rows_end(tiny_llama, monkeypatch):
    """Base, sampled: rows end at different times; the static path keeps finished rows in their slots,
    then moves the live rows to buckets of 8, 4, 2, 1 slots, and every sample is the engine's."""
    _many_eos(tiny_llama, monkeypatch)
    moves = _count_bucket_moves(monkeypatch)
    prompts = _prompts(tiny_llama.tokenizer)
    engine, static = _both(tiny_llama, prompts, 4, ENDING, seeds=[1, 2, 3])
    lengths = {g.n_tokens for gs in engine for g in gs}
    assert len(lengths) > 3 and min(lengths) < 24, "the test needs rows that end at different times"
    assert moves and all(m & (m - 1) == 0 for m in moves), moves  # buckets are powers of two (of 12 rows)
    _assert_same(engine, static)


def test_static_equals_engine_greedy_with_padding(tiny_qwen2):
    """Greedy Base with prompts of different lengths (left padding in the static cache and its mask)."""
    prompts = _prompts(tiny_qwen2.tokenizer)
    p = SampleParams(temperature=0.0, max_new_tokens=20, max_steps=10_000, stop_at_answer=False)
    _assert_same(*_both(tiny_qwen2, prompts, 2, p))


def test_static_equals_engine_ctrls_lockstep(tiny_qwen2, monkeypatch):
    """CTRLS with a state redraw at most tokens, three policies and epsilons in one batch (lockstep RL),
    rows ending at different times: tokens, states and Eq. 16's log-actions equal the engine's."""
    _frequent_boundaries(monkeypatch)
    _many_eos(tiny_qwen2, monkeypatch)
    moves = _count_bucket_moves(monkeypatch)
    prompts = _prompts(tiny_qwen2.tokenizer)
    model = random_ctrls(tiny_qwen2, K=5, trained=True, scale=0.5, seed=3)
    pols = [copy.deepcopy(model.policy) for _ in range(3)]
    with torch.no_grad():
        for i, p in enumerate(pols):
            p.L.add_(torch.randn(p.L.shape, generator=torch.Generator().manual_seed(i)) * 3)
    assert all(isinstance(p, TransitionPolicy) for p in pols)
    jobs = [(r, i) for r in range(3) for i in range(len(prompts))]
    p = replace(ENDING, top_k=20, max_new_tokens=20, batch_size=64)
    engine, static = _both(tiny_qwen2, [prompts[i] for _, i in jobs], 2, p, model=model,
                           seeds=[100 + k for k in range(len(jobs))], policies=[pols[r] for r, _ in jobs],
                           epsilons=[[0.0, 0.3, 0.6][r] for r, _ in jobs])
    assert moves
    assert sum(len(g.states) for gs in engine for g in gs) > 3 * len(jobs) * 2  # states were redrawn
    _assert_same(engine, static)


def test_static_equals_engine_fixed_s0(tiny_llama, monkeypatch):
    """The fixed-s0 ablation (transitions=False) on the static path: s_0 conditions every token."""
    _frequent_boundaries(monkeypatch)
    _many_eos(tiny_llama, monkeypatch)
    prompts = _prompts(tiny_llama.tokenizer)
    model = random_ctrls(tiny_llama, K=5, trained=True, scale=0.5, seed=2)
    p = replace(ENDING, epsilon=0.5, transitions=False)
    _assert_same(*_both(tiny_llama, prompts, 3, p, model=model, seeds=[4, 5, 6]))


def test_compiled_static_step_equals_the_engine(tiny_llama, monkeypatch):
    """torch.compile (inductor) of the static step: the same samples as the engine, Base on one row (one
    compiled shape), CTRLS across a bucket move (two compiled shapes). Each graph is a cold inductor
    compile of tens of seconds on a fresh machine; Base across a move is the eager static path's test."""
    _many_eos(tiny_llama, monkeypatch)
    moves = _count_bucket_moves(monkeypatch)
    prompts = _prompts(tiny_llama.tokenizer)[:2]
    p = replace(ENDING, max_new_tokens=12, decode="static", compile="default", epsilon=0.2)
    _assert_same(*_both(tiny_llama, prompts[:1], 1, p, seeds=[11]))
    assert not moves  # one row: no move
    model = random_ctrls(tiny_llama, K=4, trained=True, scale=0.5, seed=1)
    _assert_same(*_both(tiny_llama, prompts, 1, p, model=model, seeds=[11, 12]))
    assert moves


def _count_row_moves(monkeypatch):
    import ctrls.generate.static_decode as S

    moves = []
    orig = S.select_row_cache
    monkeypatch.setattr(S, "select_row_cache", lambda cache, config, idx: (moves.append(len(idx)),
                                                                          orig(cache, config, idx))[1])
    return moves


def _state_prompt(bb, seed=0, with_head=False):
    from ctrls.generate.conditioning import StatePromptConditioning
    from tests.generate.test_conditioning import _head, state_prompt

    _, _, cond = state_prompt(bb, head=_head(bb) if with_head else None)
    if seed:  # another training run: its own Q_phi, policy and vectors
        from ctrls.method.state_prompt import StatePrompt

        model = random_ctrls(bb, K=4, trained=True, scale=0.5, seed=seed)
        cond = StatePromptConditioning(model, StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(),
                                                          seed=seed), head=cond.head)
    return cond


def _same_fed(engine, static):
    _assert_same(engine, static, states=False)
    for e, s in zip([g for gs in engine for g in gs], [g for gs in static for g in gs]):
        assert torch.equal(s.states, e.states) and torch.equal(s.log_actions, e.log_actions)
        if e.encoded is not None:
            assert list(s.encoded) == list(e.encoded) and torch.equal(s.encoded_s0, e.encoded_s0)


@pytest.mark.parametrize("with_head", [False, True])
def test_static_equals_engine_under_the_state_prompt(tiny_llama, monkeypatch, with_head):
    """The state prompt on the static path: rows open steps at different tokens (a vector step beside the
    token step, the other rows' slots padding) and end at different times (bucket moves); tokens, spans,
    finish reasons, drawn chains, Eq. 16's log-actions and the read-back states equal the engine's."""
    _many_eos(tiny_llama, monkeypatch)
    moves = _count_row_moves(monkeypatch)
    cond = _state_prompt(tiny_llama, with_head=with_head)
    prompts = _prompts(tiny_llama.tokenizer)
    p = replace(ENDING, max_new_tokens=20, max_steps=6, epsilon=0.3)
    import ctrls.generate.decoding as decoding

    nl = decoding.newline_token_ids(tiny_llama.tokenizer)
    monkeypatch.setattr(decoding, "newline_token_ids", lambda tok: frozenset(nl | set(range(3, 49152, 7))))
    engine, static = _both(tiny_llama, prompts, 4, p, seeds=[1, 2, 3], conditioning=cond,
                           read_states=cond.model)
    flat = [g for gs in engine for g in gs]
    assert len({g.n_tokens for g in flat}) > 3 and len({len(g.spans) for g in flat}) > 2, "rows must differ"
    assert moves
    _same_fed(engine, static)


def test_static_equals_engine_for_state_prompt_runs_in_lockstep(tiny_llama, monkeypatch):
    """Two training runs' state prompts in one static batch: each sample is the engine's (and so its run's alone)."""
    from ctrls.generate.conditioning import LockstepConditioning

    _many_eos(tiny_llama, monkeypatch)
    _frequent_boundaries(monkeypatch)
    runs = [_state_prompt(tiny_llama), _state_prompt(tiny_llama, seed=3)]
    prompts = _prompts(tiny_llama.tokenizer)
    p = replace(ENDING, max_new_tokens=16, max_steps=5, epsilon=0.2)
    engine, static = _both(tiny_llama, prompts + prompts[:1], 2, p, seeds=[1, 2, 3, 4],
                           conditioning=LockstepConditioning(runs, [0, 1, 0, 1]))
    _same_fed(engine, static)


def test_compiled_state_prompt_step_equals_the_engine(tiny_llama):
    """torch.compile of the state prompt's two static passes (the token step and the vector step, one row):
    the same sample as the engine."""
    cond = _state_prompt(tiny_llama)
    p = replace(ENDING, max_new_tokens=10, max_steps=4, decode="static", compile="default", epsilon=0.2)
    _same_fed(*_both(tiny_llama, _prompts(tiny_llama.tokenizer)[:1], 1, p, seeds=[11], conditioning=cond))


@pytest.mark.integration
def test_static_equals_engine_on_the_real_backbone(smollm):
    """SmolLM2-135M with a random CTRLS model, word problems with the demo's 1-shot chat prompt, seeded
    sampling at eta = 0.7 with epsilon = 0.1: the samples (ending at EOS, after the answer line or at the
    token limit, at different times) equal the engine's."""
    from ctrls.data.prompts import prompt_ids

    questions = ["Ana has 4 cards. Then Ana gets 6 more cards. How many cards does Ana have now?",
                 "Tom has 9 apples and eats 3 of them. How many apples does Tom have left?"]
    prompts = [prompt_ids(smollm.tokenizer, q, True, 1) for q in questions]
    model = random_ctrls(smollm, K=8, k=4, rank=16, trained=True, scale=0.05, seed=0)
    p = SampleParams(temperature=0.7, top_k=50, max_new_tokens=40, max_steps=12, epsilon=0.1, batch_size=8)
    engine, static = _both(smollm, prompts, 4, p, model=model, seeds=[7, 8])
    assert len({g.n_tokens for gs in engine for g in gs}) > 2
    _assert_same(engine, static)


def test_decode_keys_are_checked():
    with pytest.raises(ValueError, match="decode must be one of"):
        SampleParams(decode="graph")
    with pytest.raises(ValueError, match="needs decode='static'"):
        SampleParams(compile="default")


def test_config_selects_and_records_the_decode_path(tmp_path):
    """sampling.decode / sampling.compile reach every stage's SampleParams, are written to the run's
    config.yaml, and compiling the engine is refused at load."""
    from ctrls.config.schema import ConfigError, load_config, save_config
    from ctrls.stages.common import sample_params

    cfg = load_config("smoke", ["sampling.decode=static", "sampling.compile=default"])
    p = sample_params(cfg, 0.7, epsilon=0.1)
    assert (p.decode, p.compile) == ("static", "default")
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "decode: static" in text and "compile: default" in text
    assert load_config("paper").sampling.decode == "static"
    with pytest.raises(ConfigError, match="sampling.compile"):
        load_config("smoke", ["sampling.compile=reduce-overhead"])


def test_static_cache_refuses_sliding_window_layers(tokenizer):
    """A model whose static cache has sliding-window layers gets a clear error naming the key to use."""
    from transformers import Qwen2Config

    from ctrls.generate.kv_cache import static_cache

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                      max_window_layers=0)
    kv = [(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))] * 2
    with pytest.raises(ValueError, match="sampling.decode=engine"):
        static_cache(cfg, kv, 3, 16)


def test_packed_attention_equals_repeated_heads():
    """``packed_sdpa_attention`` (one query token attending on the KV heads) against transformers'
    eager attention, which repeats the keys and values per query head and takes an explicit softmax;
    with masked cache positions, and the fallbacks (prefill, no grouping) unchanged."""
    from types import SimpleNamespace

    from transformers.models.llama.modeling_llama import eager_attention_forward

    from ctrls.generate.kv_cache import packed_sdpa_attention

    g = torch.Generator().manual_seed(0)
    for groups, q_len in ((3, 1), (1, 1), (2, 4)):
        b, kv, L, d = 3, 2, 11, 8
        module = SimpleNamespace(num_key_value_groups=groups, training=False, is_causal=True)
        q = torch.randn(b, kv * groups, q_len, d, generator=g)
        k, v = torch.randn(b, kv, L, d, generator=g), torch.randn(b, kv, L, d, generator=g)
        keep = torch.rand(b, 1, q_len, L, generator=g) > 0.3
        keep[..., 0] = True
        additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
        out, _ = packed_sdpa_attention(module, q, k, v, keep, scaling=d ** -0.5)
        ref, _ = eager_attention_forward(module, q, k, v, additive, scaling=d ** -0.5)
        assert out.shape == ref.shape == (b, q_len, kv * groups, d)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_static_steps_attend_on_the_kv_heads(tiny_llama, monkeypatch):
    """Every static step runs with the packed attention (compiled, transformers would repeat the KV
    cache per query head), and the model's own attention is restored afterwards."""
    import ctrls.generate.static_decode as sampling
    from ctrls.generate.kv_cache import PACKED_SDPA

    seen, real = [], sampling.step_fn

    def spy_step_fn(mode):
        step = real(mode)

        def spied(body, *a, **k):
            seen.append(body.config._attn_implementation)
            return step(body, *a, **k)
        return spied

    monkeypatch.setattr(sampling, "step_fn", spy_step_fn)
    before = tiny_llama.model.config._attn_implementation
    assert before == "sdpa"
    sample(tiny_llama, _prompts(tiny_llama.tokenizer)[:2], 2, replace(ENDING, max_new_tokens=6, decode="static"),
           seeds=[1, 2])
    assert seen and set(seen) == {PACKED_SDPA}
    assert tiny_llama.model.config._attn_implementation == before
