"""studies/injection.py's harness: a state injected inside the backbone (a hook on a decoder layer) is applied
the same way when the adapter trains on whole chains (teacher forcing, the position rule) and when the
sampler decodes with the KV cache and switches the state at each step boundary."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import LogitsProcessor, LogitsProcessorList

from ctrls.data.prompts import newline_token_ids, step_spans
from ctrls.method.adapter import StateAdapter

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def inj_mod():
    spec = importlib.util.spec_from_file_location("injection", ROOT / "studies" / "injection.py")  # moved from bench/
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _NewlineEvery(LogitsProcessor):
    """Forces a newline every ``k`` generated tokens (a random model almost never draws one)."""

    def __init__(self, nl: int, prompt_len: int, k: int):
        self.nl, self.P, self.k = nl, prompt_len, k

    def __call__(self, input_ids, scores):
        if (input_ids.shape[1] - self.P) % self.k == self.k - 1:
            scores = scores.clone()
            scores[:, self.nl] = 1e9
        return scores


@pytest.mark.parametrize("layer", [1, 0])
def test_teacher_forcing_equals_decoding_under_switched_states(tiny_llama, inj_mod, layer):
    bb = tiny_llama
    lm, tok = bb.model, bb.tokenizer
    d, K = lm.config.hidden_size, 3
    torch.manual_seed(0)
    centroids = torch.randn(K, d)
    adapter = StateAdapter(d, d, rank=8)
    torch.nn.init.normal_(adapter.up.weight, std=0.5)  # a trained-looking adapter: the state moves the logits
    inj = inj_mod.Injection(inj_mod.target_module(lm, layer), adapter)
    nl = newline_token_ids(tok)
    nl_id = tok.encode("\n", add_special_tokens=False)[0]
    prompt = tok.encode("Question: what is 2 + 3?", add_special_tokens=False)
    P, T = len(prompt), 4
    chain = torch.tensor([[2, 0, 1, 2]])
    codes = adapter.mixture_code(F.one_hot(chain, K).float(), centroids)
    sw = inj_mod.StepSwitch(lm, inj, codes, nl, tok, P)
    try:
        out = lm.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones((1, P), dtype=torch.long),
                          do_sample=False, max_new_tokens=15, min_new_tokens=15,
                          logits_processor=LogitsProcessorList([_NewlineEvery(nl_id, P, 4)]),
                          output_logits=True, return_dict_in_generate=True, pad_token_id=tok.eos_token_id)
    finally:
        sw.remove()
    gen = out.sequences[0, P:].tolist()
    decoded = torch.stack(out.logits, 1)[0]  # raw logits, before the newline forcing
    spans = step_spans(gen, nl, tok, max_steps=T)
    assert len(spans) >= 3  # several steps: the switch is exercised
    rows = torch.full((P + len(gen),), -1, dtype=torch.long)
    for t, (a, b) in enumerate(spans):
        rows[P - 1 + a: P - 1 + b] = t  # the position rule, as studies/injection.chains builds it
    item = {"ids": torch.tensor(prompt + gen), "rows": rows}
    ids, attn, code, on = inj_mod.batch([item], F.one_hot(chain[0], K).float(), adapter, centroids, 0)
    inj.code, inj.mask = code, on
    with torch.no_grad():
        forced = lm(input_ids=ids, attention_mask=attn).logits[0, P - 1:P - 1 + len(gen)]
    inj.code = inj.mask = None
    torch.testing.assert_close(forced, decoded, atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # and the states matter: the backbone alone gives other logits
        plain = lm(input_ids=ids, attention_mask=attn).logits[0, P - 1:P - 1 + len(gen)]
    assert (plain - decoded).abs().max() > 1e-2
    inj.remove()


def test_a_fresh_adapter_leaves_the_backbone_unchanged(tiny_llama, inj_mod):
    lm = tiny_llama.model
    d = lm.config.hidden_size
    adapter = StateAdapter(d, d, rank=8)  # F_u zero-initialised
    inj = inj_mod.Injection(inj_mod.target_module(lm, 1), adapter)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        plain = lm(input_ids=ids).logits
        inj.code, inj.mask = adapter.mixture_code(torch.ones(1, 5, 2) / 2, torch.randn(2, d)), torch.ones(1, 5, dtype=torch.bool)
        adapted = lm(input_ids=ids).logits
    inj.remove()
    torch.testing.assert_close(adapted, plain)


def test_the_prompt_cached_loss_equals_the_full_forward(tiny_llama, inj_mod):
    """Training runs the chains on the prompt's cached keys and values, the LM head on step tokens only: the
    summed NLL equals the full teacher-forced forward's over the same positions, for chains of one question
    padded to different lengths."""
    lm = tiny_llama.model
    d, K = lm.config.hidden_size, 3
    torch.manual_seed(1)
    centroids = torch.randn(K, d)
    adapter = StateAdapter(d, d, rank=8)
    torch.nn.init.normal_(adapter.up.weight, std=0.5)
    inj = inj_mod.Injection(inj_mod.target_module(lm, 1), adapter)
    prompt = [11, 12, 13, 14, 15, 16]
    P = len(prompt)
    items = []
    for sol, spans in (([20, 21, 22, 23, 24], [(0, 2), (2, 5)]), ([30, 31, 32], [(0, 3)])):
        rows = torch.full((P + len(sol),), -1, dtype=torch.long)
        for t, (a, b) in enumerate(spans):
            rows[P - 1 + a: P - 1 + b] = t
        items.append({"ids": torch.tensor(prompt + sol), "rows": rows, "qid": "q", "P": P})
    s_rows = F.one_hot(torch.tensor([2, 0]), K).float()
    got, n = inj_mod.nll(lm, inj, items, s_rows, adapter, centroids, 0, inj_mod.PromptCache(lm))
    want, m = 0.0, 0
    for c in items:  # one full forward per chain, no cache
        ids, attn, code, on = inj_mod.batch([c], s_rows, adapter, centroids, 0)
        inj.code, inj.mask = code, on
        with torch.no_grad():
            logits = lm(input_ids=ids).logits[0, :-1]
        inj.code = inj.mask = None
        sel = on[0, :-1]
        want += float(F.cross_entropy(logits[sel], ids[0, 1:][sel], reduction="sum"))
        m += int(sel.sum())
    inj.remove()
    assert n == m == 8
    assert abs(float(got) - want) < 2e-5  # fp32: the cached path equals the full forward to rounding
