"""The decoding loop: Base greedy equals HF generate; seeding; prefix sharing; stopping rules."""
import pytest
import torch

from ctrls.data.prompts import prompt_ids
from ctrls.generate.sampling import SampleParams, sample, seeded

RAW = SampleParams(temperature=0.0, max_new_tokens=24, max_steps=10_000, stop_at_answer=False, batch_size=64)


def _prompts(tok):
    texts = ["The cat sat on the mat and", "Two plus two is", "Once upon a time, in a land far away, there lived a"]
    return [tok(t)["input_ids"] for t in texts]


def _hf_greedy(bb, prompts, max_new_tokens):
    tok = bb.tokenizer
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": prompts}, return_tensors="pt")
    out = bb.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    eos = {tok.eos_token_id}
    gen_eos = bb.model.generation_config.eos_token_id
    eos.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    res = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        cut = next((i for i, t in enumerate(row) if t in eos), len(row))
        res.append(row[:cut])
    return res


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen2"])
def test_base_greedy_equals_hf_generate_with_padding(arch, request):
    bb = request.getfixturevalue(arch)
    prompts = _prompts(bb.tokenizer)
    assert len({len(p) for p in prompts}) > 1  # the batch really is padded
    ours = sample(bb, prompts, 1, RAW)
    ref = _hf_greedy(bb, prompts, RAW.max_new_tokens)
    for (g,), r in zip(ours, ref):
        assert g.token_ids == r


def test_same_seed_same_samples(tiny_llama):
    prompts = _prompts(tiny_llama.tokenizer)
    p = SampleParams(temperature=1.0, top_k=20, max_new_tokens=16, max_steps=100)
    a = sample(tiny_llama, prompts, 3, p, generator=seeded(7))
    b = sample(tiny_llama, prompts, 3, p, generator=seeded(7))
    c = sample(tiny_llama, prompts, 3, p, generator=seeded(8))
    ids = lambda gens: [g.token_ids for gs in gens for g in gs]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)
    # the n samples of a prompt differ from each other
    assert len({tuple(g.token_ids) for g in a[2]}) > 1


def test_prefix_sharing_matches_recomputation(tiny_qwen2):
    prompts = _prompts(tiny_qwen2.tokenizer)
    shared = sample(tiny_qwen2, prompts, 2, RAW, share_prefix=True)
    plain = sample(tiny_qwen2, prompts, 2, RAW, share_prefix=False)
    assert [[g.token_ids for g in gs] for gs in shared] == [[g.token_ids for g in gs] for gs in plain]
    assert [[(g.prompt_index, g.sample_index) for g in gs] for gs in shared] == \
        [[(i, j) for j in range(2)] for i in range(3)]


def test_small_batches_give_the_same_greedy_output(tiny_llama):
    prompts = _prompts(tiny_llama.tokenizer)
    whole = sample(tiny_llama, prompts, 2, RAW)
    one_at_a_time = sample(tiny_llama, prompts, 2, SampleParams(**{**RAW.__dict__, "batch_size": 2}))
    assert [[g.token_ids for g in gs] for gs in whole] == [[g.token_ids for g in gs] for gs in one_at_a_time]


@pytest.mark.integration
def test_stopping_rules_on_the_real_backbone(smollm):
    tok = smollm.tokenizer
    ids = [prompt_ids(tok, "Tom has 3 apples and buys 4 more. How many apples does he have?")]
    (g,), = sample(smollm, ids, 1, SampleParams(temperature=0.0, max_new_tokens=200))
    assert g.finish in ("answer", "eos") and "answer is" in g.steps[-1].lower()
    assert [s for s in g.text.split("\n") if s.strip()] == g.steps
    (g2,), = sample(smollm, ids, 1, SampleParams(temperature=0.0, max_new_tokens=200, max_steps=1))
    assert g2.finish in ("max_steps", "answer", "eos") and len(g2.steps) == 1
    (g3,), = sample(smollm, ids, 1, SampleParams(temperature=0.0, max_new_tokens=5))
    assert g3.finish == "max_tokens" and g3.n_tokens == 5
    for gen in (g, g2, g3):  # spans tile the generated tokens
        assert gen.spans[0][0] == 0 and gen.spans[-1][1] == gen.n_tokens


# ---- CTRLS: state-aware decoding --------------------------------------------------------------

from ctrls.method.adapter import adapted_logits  # noqa: E402
from ctrls.method.model import CTRLSModel  # noqa: E402


def random_ctrls(bb, K=4, k=2, rank=8, seed=0, trained=False, scale=0.02):
    """A random CTRLS model for ``bb``; ``trained``: a non-zero adapter output, so the state changes the logits."""
    return CTRLSModel.random(bb.hidden_size, K, k, rank, seed, centroid_scale=0.5, concentration=5.0,
                             adapter_std=scale if trained else None)


def test_fresh_ctrls_greedy_equals_base_greedy(tiny_llama):
    prompts = _prompts(tiny_llama.tokenizer)
    model = random_ctrls(tiny_llama)
    base = sample(tiny_llama, prompts, 2, RAW)
    ctrls = sample(tiny_llama, prompts, 2, SampleParams(**{**RAW.__dict__, "epsilon": 0.3}), model=model,
                   generator=seeded(0))
    assert [[g.token_ids for g in gs] for gs in ctrls] == [[g.token_ids for g in gs] for gs in base]
    assert all(g.states is not None and g.states.shape[1] == 4 for gs in ctrls for g in gs)
    for g in (g for gs in ctrls for g in gs):  # the exact log-actions of Eq. 16 ride along with the states
        assert g.log_actions.dtype == torch.float64 and g.log_actions.shape == g.policy_states[1:].shape
        torch.testing.assert_close(g.log_actions.exp().float(), g.policy_states[1:])
        n = len(g.states)  # the per-step states are the first draws of the trajectory
        torch.testing.assert_close(g.policy_states[:n], g.states)
        torch.testing.assert_close(torch.logsumexp(g.log_actions, -1), torch.zeros(len(g.log_actions), dtype=torch.float64))


def test_ctrls_sampling_is_seeded(tiny_qwen2):
    prompts = _prompts(tiny_qwen2.tokenizer)
    model = random_ctrls(tiny_qwen2, trained=True, scale=0.5)
    p = SampleParams(temperature=1.0, max_new_tokens=12, max_steps=100, epsilon=0.3)
    a = sample(tiny_qwen2, prompts, 2, p, model=model, generator=seeded(5))
    b = sample(tiny_qwen2, prompts, 2, p, model=model, generator=seeded(5))
    assert [g.token_ids for gs in a for g in gs] == [g.token_ids for gs in b for g in gs]
    assert all(torch.equal(x.states, y.states) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


@pytest.mark.integration
def test_state_of_each_position_follows_the_design_rule(smollm):
    """Teacher forcing with the position rule of the design notes (book/design.md) reproduces the \
sampler's greedy tokens: the position
    that predicts step t's tokens (a-1 .. b-2) carries z_t, and the forward pass that consumes a
    step's closing newline already uses the next state."""
    tok = smollm.tokenizer
    model = random_ctrls(smollm, K=6, trained=True, scale=0.05, seed=3)
    ids = prompt_ids(tok, "A shop sells pens at $3 each and books at $7 each. Ann buys 4 pens and 2 books, then "
                          "pays with a $50 bill. How much change does she get?", few_shot=1)
    params = SampleParams(temperature=0.0, max_new_tokens=60, epsilon=0.5, stop_at_answer=False)
    (g,), = sample(smollm, [ids], 1, params, model=model, generator=seeded(11))
    assert len(g.spans) >= 2, "the test needs at least one step boundary"
    step_of = torch.empty(g.n_tokens, dtype=torch.long)
    for t, (a, b) in enumerate(g.spans):
        step_of[a:b] = t
    s_pos = g.states[1 + step_of]  # predictor of generated token j sits at position len(ids) - 1 + j
    full = torch.tensor([ids + g.token_ids[:-1]])
    s_all = torch.zeros(1, full.shape[1], 6)
    s_all[0, len(ids) - 1:] = s_pos
    with torch.no_grad():
        logits = adapted_logits(smollm.model, model.adapter, full, s_all, model.centroids)
    assert logits[0, len(ids) - 1:].argmax(-1).tolist() == g.token_ids
    # and the test can tell: states shifted by one position give other logits at step boundaries
    s_shift = torch.zeros_like(s_all)
    s_shift[0, len(ids):] = s_pos[:-1]
    s_shift[0, len(ids) - 1] = s_pos[0]
    with torch.no_grad():
        shifted = adapted_logits(smollm.model, model.adapter, full, s_shift, model.centroids)
    boundary = [len(ids) - 1 + a for a, _ in g.spans[1:]]
    assert not torch.allclose(shifted[0, boundary], logits[0, boundary])


def test_a_sample_depends_only_on_its_seed_and_index(tiny_qwen2):
    """Per-sample random streams: drawing one sample alone, in another batch or in another batch
    size gives the same tokens and states as drawing it with all the others (what data-parallel
    sharding relies on)."""
    prompts = _prompts(tiny_qwen2.tokenizer)
    model = random_ctrls(tiny_qwen2, trained=True, scale=0.5)
    p = SampleParams(temperature=1.0, top_k=20, max_new_tokens=16, max_steps=100, epsilon=0.3, batch_size=64)
    whole = sample(tiny_qwen2, prompts, 3, p, model=model, seeds=[11, 12, 13])
    alone = sample(tiny_qwen2, [prompts[1]], params=p, model=model, seeds=[12], sample_ids=[[2]])
    (g,), = alone
    ref = whole[1][2]
    assert (g.prompt_index, g.sample_index) == (0, 2) and ref.sample_index == 2
    assert g.token_ids == ref.token_ids and torch.allclose(g.states, ref.states, atol=1e-5)
    # a different split across batches (one sequence per batch, sample ids in two halves)
    small = SampleParams(**{**p.__dict__, "batch_size": 1})
    parts = sample(tiny_qwen2, prompts, params=small, model=model, seeds=[11, 12, 13], sample_ids=[[0, 1, 2]] * 3)
    assert [[x.token_ids for x in gs] for gs in parts] == [[x.token_ids for x in gs] for gs in whole]
    # and the seed matters: another seed for prompt 1 changes its samples, not the others'
    other = sample(tiny_qwen2, prompts, 3, p, model=model, seeds=[11, 99, 13])
    assert [x.token_ids for x in other[0]] == [x.token_ids for x in whole[0]]
    assert [x.token_ids for x in other[1]] != [x.token_ids for x in whole[1]]


def test_stream_noise_samples_the_softmax():
    """Gumbel-max with the counter-based uniforms draws from softmax(logits / T): frequencies over
    many rows match the probabilities (a chi-square bound), and the uniforms look uniform."""
    from ctrls.generate.sampling import _pick
    from ctrls.method.streams import stream_uniform

    u = stream_uniform(torch.arange(2000), torch.zeros(2000, dtype=torch.long), 8)
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    assert not torch.equal(u, stream_uniform(torch.arange(2000), torch.ones(2000, dtype=torch.long), 8))
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    n, T = 20000, 0.7
    picks = _pick(logits.expand(n, -1), T, 0, torch.full((n,), 5), torch.arange(n))
    freq = torch.bincount(picks, minlength=5).double()
    expect = n * torch.softmax(logits.double() / T, -1)
    chi2 = float(((freq - expect) ** 2 / expect).sum())
    assert chi2 < 20.0, chi2  # 4 degrees of freedom: P(chi2 > 20) < 1e-3
    # top-k: tokens outside the top k are never drawn
    picks3 = _pick(logits.expand(n, -1), T, 3, torch.full((n,), 6), torch.arange(n))
    assert set(picks3.tolist()) == {0, 1, 4}


# ---- the KV cache: PreallocatedLayer against transformers' DynamicLayer -------------------------

def test_preallocated_layer_equals_dynamic_layer_through_growth_and_row_drops():
    """Every update, row selection (rows ending, a reordering) and expansion gives the same keys and
    values as transformers' concatenating DynamicLayer; the buffer keeps its capacity after a drop."""
    from transformers.cache_utils import DynamicLayer

    from ctrls.generate.sampling import PreallocatedLayer

    g = torch.Generator().manual_seed(0)
    ours, ref = PreallocatedLayer(capacity=8), DynamicLayer()
    kv = lambda b, n: (torch.randn(b, 2, n, 4, generator=g), torch.randn(b, 2, n, 4, generator=g))  # noqa: E731

    def step(b, n):
        k, v = kv(b, n)
        a, b_ = ours.update(k, v), ref.update(k, v)
        assert torch.equal(a[0], b_[0]) and torch.equal(a[1], b_[1])

    step(3, 5)
    ours.batch_repeat_interleave(2), ref.batch_repeat_interleave(2)  # prefix sharing: 3 prompts -> 6 rows
    step(6, 1)
    for sel in ([0, 2, 3, 5], [1, 2, 3], [2, 0]):  # rows end (and a reordering)
        idx = torch.tensor(sel)
        ours.batch_select_indices(idx), ref.batch_select_indices(idx)
        assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
        assert ours._k.shape[2] >= 8  # the capacity is kept
        step(len(sel), 1)
    step(2, 6)  # past the capacity: the buffer grows
    assert ours._k.shape[2] >= 16


def test_decoding_with_rows_ending_equals_the_concatenating_cache(tiny_llama, monkeypatch):
    """Tokens sampled with PreallocatedLayer equal those with transformers' DynamicCache while rows end
    at different times (many token ids made EOS): the row drops copy the right rows."""
    from transformers import DynamicCache

    import ctrls.generate.decoding as D
    import ctrls.generate.sampling as S

    monkeypatch.setattr(tiny_llama.model.generation_config, "eos_token_id", list(range(0, 49152, 40)))
    prompts = _prompts(tiny_llama.tokenizer)
    p = SampleParams(temperature=1.0, top_k=0, max_new_tokens=24, max_steps=10_000, stop_at_answer=False)
    drops = []
    orig = S.PreallocatedLayer.batch_select_indices
    monkeypatch.setattr(S.PreallocatedLayer, "batch_select_indices",
                        lambda self, idx: (drops.append(len(idx)), orig(self, idx))[1])
    ours = sample(tiny_llama, prompts, 4, p, seeds=[1, 2, 3])
    monkeypatch.setattr(D, "new_cache", lambda model, capacity: DynamicCache(config=model.config))
    ref = sample(tiny_llama, prompts, 4, p, seeds=[1, 2, 3])
    lengths = {g.n_tokens for gs in ours for g in gs}
    assert len(lengths) > 3 and min(lengths) < 24 and drops, "the test needs rows that end at different times"
    assert [[g.token_ids for g in gs] for gs in ours] == [[g.token_ids for g in gs] for gs in ref]


# ---- the "fixed s0" ablation: SampleParams(transitions=False) ----------------------------------


def _frequent_boundaries(monkeypatch):
    """Declare every token a newline, so that a tiny random model (whose greedy output repeats one
    token) closes a step at every non-blank token and the state redraw path runs."""
    import ctrls.generate.decoding as decoding

    monkeypatch.setattr(decoding, "newline_token_ids", lambda tok: frozenset(range(len(tok))))


def _teacher_forced(bb, model, prompt, g, s_of_token, params=None, key=None):
    """The tokens the sampler's rule picks under teacher forcing, the state of each position given per
    generated token: greedy, or (``params.temperature > 0``) Gumbel-max with the sample's own noise
    stream ``key`` (ctrls.generate.sampling's module docstring)."""
    from ctrls.generate.sampling import _pick

    full = torch.tensor([prompt + g.token_ids[:-1]])
    s_all = torch.zeros(1, full.shape[1], model.config.n_states)
    s_all[0, len(prompt) - 1:] = s_of_token
    with torch.no_grad():
        logits = adapted_logits(bb.model, model.adapter, full, s_all, model.centroids)[0, len(prompt) - 1:]
    if params is None or params.temperature <= 0:
        return logits.argmax(-1).tolist()
    n = logits.shape[0]
    return _pick(logits, params.temperature, params.top_k, torch.full((n,), key), torch.arange(n)).tolist()


def test_fixed_state_decodes_with_s0_at_every_position(tiny_llama, monkeypatch):
    """transitions=False: every generated position carries the prompt's s_0 (teacher forcing with
    z = z_0 everywhere reproduces the sampled tokens, noise stream included), the rows' states are
    s_0 repeated per step, and no state is drawn (the policy's sampler is never called)."""
    from ctrls.method.streams import stream_key

    _frequent_boundaries(monkeypatch)
    bb = tiny_llama
    prompts = _prompts(bb.tokenizer)
    model = random_ctrls(bb, K=5, trained=True, scale=5.0, seed=2)
    with torch.no_grad():
        model.adapter.state.weight.mul_(10)  # the state moves the logits by several units: the test can tell
    fixed = SampleParams(temperature=1.0, top_k=0, max_new_tokens=20, max_steps=10_000, stop_at_answer=False,
                         epsilon=0.5, transitions=False)
    seeds = [1, 2, 3]

    def no_draws(*a, **k):
        raise AssertionError("a state was drawn with transitions=False")

    with monkeypatch.context() as m:
        m.setattr(model.policy, "sample", no_draws)
        gens = sample(bb, prompts, 2, fixed, model=model, seeds=seeds)
    for i, gs in enumerate(gens):
        for g in gs:
            assert len(g.spans) >= 3, "the test needs step boundaries"
            assert g.states.shape == (len(g.spans) + 1, 5)
            assert torch.equal(g.states, g.states[:1].expand_as(g.states))  # s_0 repeated, one row per step
            key = stream_key(seeds[i], g.sample_index)
            assert _teacher_forced(bb, model, prompts[i], g, g.states[0], fixed, key) == g.token_ids
    # the test can tell: with transitions the states move, and s_0 alone no longer reproduces the tokens
    moving = sample(bb, prompts, 2, SampleParams(**{**fixed.__dict__, "transitions": True}), model=model, seeds=seeds)
    differs = 0
    for i, gs in enumerate(moving):
        for g in gs:
            assert not torch.equal(g.states, g.states[:1].expand_as(g.states))
            key = stream_key(seeds[i], g.sample_index)
            differs += _teacher_forced(bb, model, prompts[i], g, g.states[0], fixed, key) != g.token_ids
    assert differs >= 3


def test_a_held_state_decodes_every_position_under_it(tiny_llama, monkeypatch):
    """hold=j (a constant-state row): teacher forcing with state j at every position reproduces the sampled
    tokens, the rows record s_0 then j at every step; the test can tell j from s_0 (another j decodes other tokens)."""
    import torch.nn.functional as F

    from ctrls.method.streams import stream_key

    _frequent_boundaries(monkeypatch)
    bb = tiny_llama
    prompts = _prompts(bb.tokenizer)
    model = random_ctrls(bb, K=5, trained=True, scale=5.0, seed=2)
    with torch.no_grad():
        model.adapter.state.weight.mul_(10)
    base = dict(temperature=1.0, top_k=0, max_new_tokens=20, max_steps=10_000, stop_at_answer=False, transitions=False)
    seeds, differs = [1, 2, 3], 0
    for j in (0, 3):
        gens = sample(bb, prompts, 2, SampleParams(**base, hold=j), model=model, seeds=seeds)
        held = F.one_hot(torch.tensor(j), 5).float()
        for i, gs in enumerate(gens):
            for g in gs:
                assert len(g.spans) >= 3 and torch.equal(g.states[1:], held.expand(len(g.spans), 5))
                key = stream_key(seeds[i], g.sample_index)
                assert _teacher_forced(bb, model, prompts[i], g, held, SampleParams(**base), key) == g.token_ids
                other = F.one_hot(torch.tensor(4 - j), 5).float()
                differs += _teacher_forced(bb, model, prompts[i], g, other, SampleParams(**base), key) != g.token_ids
    assert differs >= 3
    with pytest.raises(ValueError, match="hold=7"):
        sample(bb, prompts, 1, SampleParams(**base, hold=7), model=model, seeds=seeds)
    with pytest.raises(ValueError, match="hold must be"):
        SampleParams(hold="s1")


def test_fixed_state_draws_consume_no_state_randomness(tiny_qwen2, monkeypatch):
    """With transitions=False the samples do not depend on anything a state draw would read: not the
    transition logits L, not epsilon (temperature > 0, so token noise is still drawn)."""
    _frequent_boundaries(monkeypatch)
    bb = tiny_qwen2
    prompts = _prompts(bb.tokenizer)
    model = random_ctrls(bb, K=4, trained=True, scale=0.5, seed=4)
    p = SampleParams(temperature=1.0, top_k=20, max_new_tokens=16, max_steps=10_000, stop_at_answer=False,
                     epsilon=0.3, transitions=False)
    a = sample(bb, prompts, 3, p, model=model, seeds=[5, 6, 7])
    with torch.no_grad():
        model.policy.L.copy_(torch.randn_like(model.policy.L) * 3)
    b = sample(bb, prompts, 3, SampleParams(**{**p.__dict__, "epsilon": 0.9}), model=model, seeds=[5, 6, 7])
    assert [g.token_ids for gs in a for g in gs] == [g.token_ids for gs in b for g in gs]
    assert all(torch.equal(x.states, y.states) for xs, ys in zip(a, b) for x, y in zip(xs, ys))
    # the same change moves the samples when transitions are drawn
    on = SampleParams(**{**p.__dict__, "transitions": True})
    c = sample(bb, prompts, 3, on, model=model, seeds=[5, 6, 7])
    with torch.no_grad():
        model.policy.L.copy_(torch.randn_like(model.policy.L) * 3)
    d = sample(bb, prompts, 3, on, model=model, seeds=[5, 6, 7])
    assert [g.states.argmax(-1).tolist() for gs in c for g in gs] != [g.states.argmax(-1).tolist() for gs in d for g in gs]


@pytest.mark.integration
def test_fixed_state_follows_the_design_rule_on_the_real_backbone(smollm):
    """The real backbone's own step boundaries: with transitions=False teacher forcing with s_0 at
    every position reproduces the sampler's greedy tokens."""
    tok = smollm.tokenizer
    model = random_ctrls(smollm, K=6, trained=True, scale=0.05, seed=3)
    ids = prompt_ids(tok, "A shop sells pens at $3 each and books at $7 each. Ann buys 4 pens and 2 books, then "
                          "pays with a $50 bill. How much change does she get?", few_shot=1)
    params = SampleParams(temperature=0.0, max_new_tokens=60, epsilon=0.5, stop_at_answer=False, transitions=False)
    (g,), = sample(smollm, [ids], 1, params, model=model, seeds=[11])
    assert len(g.spans) >= 2, "the test needs at least one step boundary"
    assert torch.equal(g.states, g.states[:1].expand_as(g.states))
    assert _teacher_forced(smollm, model, ids, g, g.states[0]) == g.token_ids


# ---- Eq. 16 sees every state draw that conditioned a sampled token ------------------------------


@pytest.mark.parametrize("script", [["x", "\n", " x", "\n", "EOS"], ["x", "\n", " x", "\n", " ", "EOS"]],
                         ids=["step-then-EOS", "step-then-whitespace-then-EOS"])
def test_every_draw_that_conditioned_a_token_enters_eq16(tiny_llama, monkeypatch, script):
    """Scripted tokens "x\n x\n EOS": s_1 is drawn before "x", s_2 when step 1 closes, s_3 when step 2
    closes; s_3 conditioned the EOS draw (and the whitespace before it), so all three draws are
    Eq. 16's actions, though only two steps exist. Counts the draws, then checks the loss sees them."""
    import ctrls.generate.conditioning as conditioning
    import ctrls.generate.sampling as sampling_mod
    from ctrls.method.reinforce import Trajectory, reinforce_loss

    bb = tiny_llama
    tok = bb.tokenizer
    ids = {t: tok.eos_token_id if t == "EOS" else tok(t, add_special_tokens=False)["input_ids"] for t in script}
    assert all(isinstance(v, int) or len(v) == 1 for v in ids.values()), ids
    seq = [v if isinstance(v, int) else v[0] for v in (ids[t] for t in script)]

    def scripted(logits, temperature, top_k, keys, counters):
        return torch.tensor([seq[int(c)] for c in counters])

    draws = []
    real_draw = conditioning.draw_states

    def counting(model, prev, rows, epsilon):
        draws.append(len(rows))
        return real_draw(model, prev, rows, epsilon)

    monkeypatch.setattr(sampling_mod, "_pick", scripted)
    monkeypatch.setattr(conditioning, "draw_states", counting)
    model = random_ctrls(bb, K=4, trained=True, scale=0.5)
    p = SampleParams(temperature=1.0, max_new_tokens=20, max_steps=10_000, stop_at_answer=False, epsilon=0.2)
    (g,), = sample(bb, [tok("Q:")["input_ids"]], 1, p, model=model, seeds=[3])
    assert g.finish == "eos" and len(g.spans) == 2 and g.steps == ["x", "x"]
    assert sum(draws) == 3  # s_1, s_2, s_3
    assert g.states.shape == (3, 4)  # per step: s_0, s_1, s_2
    assert g.log_actions.shape == (3, 4) and g.policy_states.shape == (4, 4)
    torch.testing.assert_close(g.policy_states[1:], g.log_actions.exp().float())
    # the loss counts three log pi~ terms: equal to a reference summed over all three draws
    pol = model.policy
    loss, _ = reinforce_loss(pol, [Trajectory(g.policy_states, 1.0, 0, log_actions=g.log_actions)], 0.2, 0.0)
    ref = -sum(pol.log_prob_log(g.log_actions[t], g.policy_states[t], 0.2) for t in range(3))
    torch.testing.assert_close(loss, ref.to(loss.dtype))


# ---- the prompts' shared prefix, prefilled once per batch ------------------------------------------


def _prefixed_prompts(tok):
    """Prompts that share a 40+ token start (a system prompt, as the chat template makes), with own
    suffixes of different lengths, one prompt twice, and one that is the prefix plus a single token."""
    head = tok("You are a careful assistant. Solve the problem step by step, one step per line, and end "
               "with a line 'The answer is X'. Example: two plus two. Step: 2 + 2 = 4. The answer is 4.")["input_ids"]
    assert len(head) >= 40
    tails = ["Question: Ana has 4 cards and gets 6 more.", "Question: Tom eats 3 of his 9 apples, how many now?",
             "Question: Ana has 4 cards and gets 6 more.", "Q"]
    return [head + tok(t, add_special_tokens=False)["input_ids"] for t in tails], len(head)


def test_shared_prefix_length():
    from ctrls.generate.sampling import MIN_SHARED_PREFIX, shared_prefix_length

    a = list(range(100))
    assert shared_prefix_length([a, a[:60] + [7, 8]]) == 60
    assert shared_prefix_length([a, a]) == 99  # identical prompts keep one token of their own
    assert shared_prefix_length([a]) == 0
    assert shared_prefix_length([a, a[:MIN_SHARED_PREFIX - 1] + [-1] * 50]) == 0  # too short to bother


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefix_prefill_equals_prompts_prefilled_whole(tiny_llama, temperature):
    """Prefilling the prompts' shared prefix once, then each suffix on its cache, gives the samples and
    s_0 of prefilling every prompt whole (the reference path, share_prefix=False), with s_0 read from
    hidden states that start inside the prefix (start 10) and after it (start = prefix + 2)."""
    prompts, L = _prefixed_prompts(tiny_llama.tokenizer)
    model = random_ctrls(tiny_llama, K=5, trained=True, scale=0.5, seed=4)
    p = SampleParams(temperature=temperature, top_k=20, max_new_tokens=12, max_steps=100, epsilon=0.3)
    assert len(prompts[3]) == L + 1
    for starts in ([10] * 4, [L + 2, L + 2, L + 2, L]):
        kw = dict(model=model, seeds=[1, 2, 3, 4], prompt_starts=starts)
        shared = sample(tiny_llama, prompts, 2, p, share_prefix=True, **kw)
        whole = sample(tiny_llama, prompts, 2, p, share_prefix=False, **kw)
        assert [g.token_ids for gs in shared for g in gs] == [g.token_ids for gs in whole for g in gs]
        for x, y in zip((g for gs in shared for g in gs), (g for gs in whole for g in gs)):
            torch.testing.assert_close(x.states, y.states, rtol=1e-4, atol=1e-5)
    from ctrls.generate.sampling import shared_prefix_length

    assert shared_prefix_length(prompts) >= 40  # the shared-prefix prefill ran


def test_row_groups_keep_prompts_whole_within_the_batch_size():
    """Prompts in order, at most batch_size rows a group, a prompt's rows never split, an oversized prompt
    alone, a prompt without rows left out."""
    from ctrls.generate.sampling import row_groups

    assert row_groups([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
    assert row_groups([3, 0, 3, 3], 7) == [[0, 2], [3]]
    assert row_groups([2, 9, 2], 4) == [[0], [1], [2]]
    assert row_groups([1] * 5, 128) == [[0, 1, 2, 3, 4]]
    assert row_groups([], 4) == [] and row_groups([0, 0], 4) == []
