"""The decoding loop: Base greedy equals HF generate; seeding; prefix sharing; stopping rules."""
import pytest
import torch

from ctrls.prompts import prompt_ids
from ctrls.sampling import SampleParams, sample, seeded

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
