"""Reading each generated step's state back from the sampler's own pass (``sample(..., read_states=model)``,
``ctrls.generate.decoding.StepReader``) against re-encoding the generation in a second forward pass
(``ctrls.generate.controllability.encode_generations``): the same states for every row kind (Base, fixed s0,
CTRLS(epsilon)), on both decode paths, and the samples unchanged by reading."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import requires_data

from ctrls.generate import controllability as ctl
from ctrls.generate.sampling import SampleParams, sample
from ctrls.method.model import CTRLSModel
from tests.generate.test_sampling import _prompts, random_ctrls


def _kinds(model):
    """(label, decoding model, transitions) of the exploration grid's row kinds."""
    return [("Base", None, True), ("fixed s0", model, False), ("eps", model, True)]


def _compare(bb, model, prompts, starts, gens) -> tuple[int, int]:
    """(equal, total) steps between the states read back and ``encode_generations``' (which also
    gives s_0: checked close to the one read back)."""
    eq = tot = 0
    for i, gs in enumerate(gens):
        s0, ref = ctl.encode_generations(bb, model, prompts[i], starts[i], gs)
        for g, r in zip(gs, ref):
            assert g.encoded is not None and len(g.encoded) == len(g.spans) == len(r)
            torch.testing.assert_close(g.encoded_s0, s0, rtol=1e-4, atol=1e-5)
            eq += sum(a == b for a, b in zip(g.encoded, r))
            tot += len(r)
    return eq, tot


def _fitted(bb, prompts, starts, gens, K: int, k: int, rank: int, seed: int) -> CTRLSModel:
    """A random CTRLS model whose K centroids are fitted (k-means) on the re-encoded steps of ``gens``,
    so that the steps spread over the states (random centroids put nearly every step in one)."""
    from ctrls.method.states import fit_states

    model = random_ctrls(bb, K=K, k=k, rank=rank, trained=True, scale=0.05, seed=seed)
    steps = []
    for i, gs in enumerate(gens):
        for g in gs:
            h = bb.hidden_states(torch.tensor([list(prompts[i]) + g.token_ids]))[0]
            steps += [ctl.feature_precision(h[len(prompts[i]) + a:len(prompts[i]) + b]) for a, b in g.spans]
    with torch.no_grad():
        model.centroids.copy_(fit_states(model.embed(steps), K, seed=0).centroids)
    return model


def test_read_states_equal_the_reencoded_ones_on_both_paths(tiny_llama, monkeypatch, one_thread):
    """A tiny random backbone with many EOS ids and a newline at every 7th id: rows end at every rule
    (EOS, the T-th step, the token limit) and at different times (row drops, bucket moves). For every
    row kind and both decode paths the states read back equal the re-encoded ones, step for step, and
    reading changes no sample."""
    import ctrls.generate.decoding as D

    bb = tiny_llama
    monkeypatch.setattr(bb.model.generation_config, "eos_token_id", list(range(0, 49152, 50)))
    monkeypatch.setattr(D, "newline_token_ids", lambda tok: frozenset(range(0, 49152, 7)))
    prompts = _prompts(bb.tokenizer)
    starts = [0, 2, 1][:len(prompts)]
    p = SampleParams(temperature=1.0, top_k=0, max_new_tokens=30, max_steps=4, epsilon=0.3, batch_size=16)
    seeds = list(range(1, len(prompts) + 1))
    base = sample(bb, prompts, 4, p, seeds=seeds, prompt_starts=starts)
    model = _fitted(bb, prompts, starts, base, K=4, k=2, rank=8, seed=1)
    finishes, seen = set(), set()
    for decode in ("engine", "static"):
        for label, m, transitions in _kinds(model):
            q = replace(p, decode=decode, transitions=transitions)
            plain = sample(bb, prompts, 4, q, model=m, seeds=seeds, prompt_starts=starts)
            read = sample(bb, prompts, 4, q, model=m, seeds=seeds, prompt_starts=starts, read_states=model)
            tokens = [g.token_ids for gs in read for g in gs]
            assert tokens == [g.token_ids for gs in plain for g in gs], (decode, label)
            assert all(g.encoded is None for gs in plain for g in gs)
            eq, tot = _compare(bb, model, prompts, starts, read)
            assert eq == tot > 0, (decode, label, eq, tot)
            finishes |= {g.finish for gs in read for g in gs}
            seen |= {s for gs in read for g in gs for s in g.encoded}
    assert finishes >= {"eos", "max_steps", "max_tokens"} and len(seen) > 1


def test_answer_line_is_read_with_its_newline(tiny_llama, monkeypatch, one_thread):
    """A row that stops after its answer line ends on that line's newline, which the loop never feeds
    on: the reader feeds it once more, so every token's hidden state is read, the newline's included,
    and each equals the one a full forward of prompt + generation computes (to float16 rounding)."""
    import ctrls.generate.decoding as D
    import ctrls.generate.sampling as S
    import ctrls.generate.static_decode as SD

    bb = tiny_llama
    tok = bb.tokenizer
    seq = tok(" x\n The answer is 4\n more\n", add_special_tokens=False)["input_ids"]
    nl = {i for i in seq if "\n" in tok.decode([i])}
    monkeypatch.setattr(D, "newline_token_ids", lambda t: frozenset(nl))
    def scripted(*args):  # the engine's pick and the static path's draw: token c of the script, c = counter
        return torch.tensor([seq[min(int(c), len(seq) - 1)] for c in args[-1]])

    monkeypatch.setattr(S, "_pick", scripted)
    monkeypatch.setattr(SD, "draw_tokens", scripted)
    read = []
    hidden = D.StepReader.hidden
    monkeypatch.setattr(D.StepReader, "hidden", lambda self, n: read.append(hidden(self, n)) or read[-1])
    prompt = tok("Q: 2 + 2?")["input_ids"]
    P = len(prompt)
    model = random_ctrls(bb, K=4, k=2, rank=8, trained=True, scale=0.05, seed=3)
    for m in (None, model):
        for decode in ("engine", "static"):
            read.clear()
            (g,), = sample(bb, [prompt], 1, SampleParams(max_new_tokens=40, decode=decode), model=m, seeds=[5],
                           read_states=model)
            assert g.finish == "answer" and g.steps == ["x", "The answer is 4"]
            assert tok.decode(g.token_ids[g.spans[-1][0]:g.spans[-1][1]]).endswith("\n")
            assert _compare(bb, model, [prompt], [0], [[g]]) == (2, 2)
            h = bb.hidden_states(torch.tensor([prompt + g.token_ids]))[0, P:]
            (H,), = read
            assert H.shape == h.shape  # the answer line's newline too
            torch.testing.assert_close(H.float(), ctl.feature_precision(h), rtol=2e-3, atol=2e-3)


@pytest.mark.integration
def test_read_states_equal_the_reencoded_ones_on_the_real_backbone(smollm, one_thread):
    """SmolLM2-135M, word problems with the demo's 1-shot chat prompt, eta = 0.7: for Base, fixed-s0 and
    CTRLS(0.1) rows the states read back from the sampler's pass equal those of a second forward pass
    (``encode_generations``) on at least 99% of the steps (all of them when this was written; a step can
    differ where its embedding is within fp32 rounding of two centroids: decoding computes a token's
    hidden state on a left-padded KV cache one token at a time, the re-encode all tokens at once, so the
    float32 sums run in another order before the float16 rounding of the feature cache). Reading
    changes no sample."""
    from ctrls.data.prompts import encode_prompt

    tok = smollm.tokenizer
    questions = ["Ana has 4 cards. Then Ana gets 6 more cards. How many cards does Ana have now?",
                 "Tom has 9 apples and eats 3 of them. How many apples does Tom have left?"]
    enc = [encode_prompt(tok, q, True, 1) for q in questions]
    prompts, starts = [e[0] for e in enc], [e[1] for e in enc]
    p = SampleParams(temperature=0.7, top_k=50, max_new_tokens=40, max_steps=12, epsilon=0.1, batch_size=16)
    seeds = [7, 8]
    base = sample(smollm, prompts, 4, p, seeds=seeds, prompt_starts=starts)
    model = _fitted(smollm, prompts, starts, base, K=6, k=2, rank=16, seed=0)
    finishes, seen, eq, tot = set(), set(), 0, 0
    for label, m, transitions in _kinds(model):
        q = replace(p, transitions=transitions)
        read = sample(smollm, prompts, 4, q, model=m, seeds=seeds, prompt_starts=starts, read_states=model)
        if m is None:
            assert [g.token_ids for gs in read for g in gs] == [g.token_ids for gs in base for g in gs]
        e, t = _compare(smollm, model, prompts, starts, read)
        print(f"{label}: {e}/{t} steps equal")
        assert e >= 0.99 * t and t > 0, (label, e, t)
        eq, tot = eq + e, tot + t
        finishes |= {g.finish for gs in read for g in gs}
        seen |= {s for gs in read for g in gs for s in g.encoded}
    assert "answer" in finishes and len(seen) > 2


@pytest.mark.integration
@requires_data
def test_exploration_reads_the_states_back_and_the_old_path_agrees(tiny_runs, tiny_model_dir, tmp_path):
    """The exploration stage (smoke profile, on the tiny model: the stage's wiring; the states on the
    real backbone are the test above's) read its states back from the sampler's pass (its done record
    says so); the old path (``explore(..., readback=False)``: a second forward pass per step) on a copy
    of its pretraining gives the same samples and, on at least 99% of the steps, the same states, and
    the same s_0 of every prompt."""
    import shutil

    from conftest import SMOKE_OVERRIDES, tiny_overrides

    from ctrls.config.schema import load_config
    from ctrls.stages.exploration import explore, load_samples, stage_summary

    ref_dir, cfg, _ = tiny_runs
    assert stage_summary(cfg)["readback"] is True
    shutil.copytree(ref_dir / cfg.profile / "pretrain", tmp_path / cfg.profile / "pretrain")
    old_cfg = load_config("smoke", [*SMOKE_OVERRIDES, *tiny_overrides(tiny_model_dir), f"run_dir={tmp_path}"])
    explore(old_cfg, progress=False, readback=False)
    assert stage_summary(old_cfg)["readback"] is False
    key = ["dataset", "temperature", "config", "question_id", "sample_index"]
    new = load_samples(cfg).sort_values(key).reset_index(drop=True)
    old = load_samples(old_cfg).sort_values(key).reset_index(drop=True)
    assert list(new.text) == list(old.text)
    pairs = [(a, b) for x, y in zip(new.encoded, old.encoded) for a, b in zip(list(x), list(y), strict=True)]
    assert len(pairs) > 10 and sum(a == b for a, b in pairs) >= 0.99 * len(pairs)
    assert list(new.s0) == list(old.s0)
