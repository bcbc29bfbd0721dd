"""The engine's three conditionings: teacher forcing equals decoding under the state prompt (its vectors
before each step, positions included; with and without the adapter's head), each sample's chain drawn
from its question's seed, and the engine's stopping rules for every conditioning."""
from dataclasses import replace

import pytest
import torch

from ctrls.generate.conditioning import (
    AdapterConditioning,
    Conditioning,
    LockstepConditioning,
    StatePromptConditioning,
    conditioning_for,
)
from ctrls.generate.sampling import SampleParams, sample
from ctrls.method.state_prompt import StatePrompt, adapter_head, chain_logprob
from tests.generate.test_sampling import random_ctrls

NL, EOS = 198, 2  # SmolLM2's tokenizer: "\n", <|im_end|>
A, B, C, D = 253, 278, 265, 287  # " a", " b", " c", " d"
PROMPTS = [[1, 5, 9, 4, 11], [1, 5, 9, 4, 11], [3, 6, 12]]  # two rows share a prompt; the third is left-padded
SCRIPTS = [[A, NL, B, C, NL, D, A, B, NL, C],  # three steps: T = 3 ends it
           [A, B, C, D, NL, A, NL, B, EOS, C],  # three steps, EOS at its 9th draw
           [NL, A, B, NL, C, D, A, B, C, D]]  # a blank first line: the step goes on
RAW = SampleParams(temperature=1.0, top_k=0, max_new_tokens=10, max_steps=3, stop_at_answer=False, epsilon=0.3)


def _head(bb, K=4):
    from ctrls.method.adapter import StateAdapter

    torch.manual_seed(0)
    d = bb.model.config.hidden_size
    ad = StateAdapter(d, 2 * d, rank=8)
    torch.nn.init.normal_(ad.up.weight, std=0.5)
    return adapter_head(bb.model, ad, torch.randn(K, 2 * d))


def state_prompt(bb, K=4, m=2, **kw):
    model = random_ctrls(bb, K=K, trained=True, scale=0.5)
    sp = StatePrompt(K, m, bb.model.get_input_embeddings().weight.detach(), seed=4)
    return model, sp, StatePromptConditioning(model, sp, **kw)


@pytest.mark.parametrize("decode", ["engine", "static"])
@pytest.mark.parametrize("with_head", [False, True])
def test_teacher_forcing_equals_decoding_under_the_state_prompt(tiny_llama, scripted, with_head, decode):
    """Rows of different prompts open their steps at different tokens, stop at EOS or the token limit, and
    one starts with a blank line: each row's log P of its step tokens equals its own teacher-forced sequence
    (``chain_logprob``, each step under its drawn state's vectors), and the blank line joins the step; on
    both decode paths (the static one feeds a step's vectors in a pass of their own)."""
    bb = tiny_llama
    head = _head(bb) if with_head else None
    model, sp, cond = state_prompt(bb, head=head)
    gens, logp = scripted(bb, PROMPTS, SCRIPTS, replace(RAW, decode=decode), conditioning=cond)
    got = [gs[0] for gs in gens]
    assert [g.spans for g in got] == [[(0, 2), (2, 5), (5, 9)], [(0, 5), (5, 7), (7, 8)], [(0, 4), (4, 10)]]
    assert [g.finish for g in got] == ["max_steps", "eos", "max_tokens"]
    for i, g in enumerate(got):
        z = g.states[1:len(g.spans) + 1]  # one-hot: each step's drawn state
        assert torch.equal(z.sum(-1), torch.ones(len(g.spans)))
        with torch.no_grad():
            lp, n = chain_logprob(bb.model, PROMPTS[i], g.token_ids, g.spans, z, sp, head=head)
        assert n == len(g.token_ids)
        assert float(lp) == pytest.approx(sum(logp[i][:len(g.token_ids)]), abs=1e-4)
        # the chain of Eq. 16: s_0, then every action opened (the last one conditioned the EOS draw)
        assert torch.equal(g.policy_states[1:].argmax(-1)[:len(g.spans)], z.argmax(-1))
        torch.testing.assert_close(g.log_actions.exp().float(), g.policy_states[1:])


def test_the_state_enters_the_step_and_a_row_does_not_depend_on_its_batch(tiny_llama, scripted):
    """Swapping a row's states changes its log P; the same row decoded alone scores every token as beside others."""
    bb = tiny_llama
    model, sp, cond = state_prompt(bb)
    (together, *_), lp_all = scripted(bb, PROMPTS, SCRIPTS, RAW, conditioning=cond)
    _, lp_one = scripted(bb, PROMPTS[:1], SCRIPTS[:1], RAW, conditioning=StatePromptConditioning(model, sp))
    assert lp_one[0] == pytest.approx(lp_all[0], abs=1e-5)
    g = together[0]
    z = g.states[1:len(g.spans) + 1]
    with torch.no_grad():
        lp, _ = chain_logprob(bb.model, PROMPTS[0], g.token_ids, g.spans, z, sp)
        other, _ = chain_logprob(bb.model, PROMPTS[0], g.token_ids, g.spans, z.roll(1, -1), sp)
    assert abs(float(lp) - float(other)) > 1e-3


def test_the_chain_is_drawn_from_the_question_seed_before_decoding(tiny_llama):
    """Sample m's states are argmax of ``draw_actions`` from ``seeded(seed)``, whichever samples are drawn with it."""
    from ctrls.generate.controllability import draw_actions
    from ctrls.generate.sampling import seeded

    bb = tiny_llama
    model, sp, cond = state_prompt(bb)
    p = SampleParams(temperature=1.0, max_new_tokens=12, max_steps=3, epsilon=0.2)
    prompt = bb.tokenizer("Q: two plus two?\n")["input_ids"]
    (whole,) = sample(bb, [prompt], 3, p, seeds=[9], conditioning=cond)
    (part,) = sample(bb, [prompt], 0, p, seeds=[9], sample_ids=[[2]], conditioning=StatePromptConditioning(model, sp))
    acts, _ = draw_actions(model.policy, whole[0].states[0], 3, 3, 0.2, generator=seeded(9))
    for g in whole:
        k = len(g.states) - 1
        assert g.states[1:].argmax(-1).tolist() == acts[g.sample_index, :k].argmax(-1).tolist()
    assert part[0].token_ids == whole[2].token_ids and torch.equal(part[0].states, whole[2].states)


@pytest.mark.parametrize("kind", ["base", "adapter", "state prompt"])
def test_every_conditioning_stops_after_the_answer_line(tiny_llama, scripted, kind):
    """One stopping rule for all three: the answer line's newline is kept and ends the sample; T steps end it."""
    bb = tiny_llama
    tok = bb.tokenizer
    line = tok("The answer is 4", add_special_tokens=False)["input_ids"]
    script = [A, NL, *line, NL, B, C, D, A, B, C, D, A]
    conds = {"base": None, "adapter": AdapterConditioning(random_ctrls(bb, trained=True)),
             "state prompt": state_prompt(bb)[2]}
    p = SampleParams(temperature=1.0, max_new_tokens=len(script), max_steps=5, stop_at_answer=True)
    (g,), = scripted(bb, PROMPTS[:1], [script], p, conditioning=conds[kind])[0]
    assert g.finish == "answer" and g.token_ids == script[:len(line) + 3] and len(g.spans) == 2
    (g,), = scripted(bb, PROMPTS[:1], [[A, NL, B, NL, C, NL, D]], SampleParams(
        temperature=1.0, max_new_tokens=7, max_steps=2), conditioning=conds[kind])[0]
    assert g.finish == "max_steps" and g.token_ids == [A, NL, B, NL]
    if kind != "base":  # s_0, then the state of each step
        assert g.states.shape[0] == 3


def test_a_conditioning_is_chosen_once(tiny_llama):
    bb = tiny_llama
    model = random_ctrls(bb)
    assert type(conditioning_for(None)) is Conditioning and conditioning_for(model).model is model
    _, _, cond = state_prompt(bb)
    assert conditioning_for(None, cond) is cond
    with pytest.raises(ValueError, match="through the conditioning"):
        conditioning_for(model, cond)
    with pytest.raises(ValueError, match="needs a CTRLS model"):
        sample(bb, [[1, 2, 3]], 1, RAW, epsilons=[0.1])
    with pytest.raises(ValueError, match="decode=static"):  # one adapter inside the compiled step
        adapters = [AdapterConditioning(random_ctrls(bb, seed=s)) for s in (0, 1)]
        sample(bb, [[1, 2, 3]], 1, SampleParams(decode="static"), conditioning=LockstepConditioning(adapters, [0]))
    with pytest.raises(ValueError, match="0 vectors"):
        StatePromptConditioning(model, StatePrompt(4, 0, bb.model.get_input_embeddings().weight.detach()))


def _runs(bb, kind):
    """Two training runs' conditionings of one kind: their own Q_phi, policy, adapter and vectors."""
    if kind == "adapter":
        return [AdapterConditioning(random_ctrls(bb, trained=True, scale=0.5, seed=s)) for s in (0, 1)]
    out = []
    for s in (0, 1):
        model = random_ctrls(bb, K=4, trained=True, scale=0.5, seed=s)
        out.append(StatePromptConditioning(model, StatePrompt(4, 2, bb.model.get_input_embeddings().weight.detach(), seed=s),
                                           head=_head(bb) if kind == "state prompt + adapter" else None))
    return out


@pytest.mark.parametrize("kind", ["adapter", "state prompt", "state prompt + adapter"])
def test_runs_in_lockstep_decode_what_each_run_decodes_alone(tiny_llama, kind):
    """Two runs' prompts in one batch (interleaved, a question shared by both): each sample's tokens, steps,
    drawn states and Eq. 16 trajectory are its run's alone; under the state prompt the read-back too."""
    bb = tiny_llama
    tok = bb.tokenizer
    qs = [tok(q)["input_ids"] for q in ("Q: one plus one?\n", "Q: two times three?\n", "Q: ten minus four?\n")]
    prompts, owner, seeds = [qs[0], qs[1], qs[1], qs[2]], [0, 1, 0, 1], [5, 6, 7, 8]
    p = SampleParams(temperature=1.0, max_new_tokens=16, max_steps=4, epsilon=0.2)
    read = kind != "adapter"
    runs = _runs(bb, kind)
    together = sample(bb, prompts, 2, p, seeds=seeds, conditioning=LockstepConditioning(runs, owner),
                      read_states=runs[0].model if read else None)
    for r in (0, 1):
        mine = [i for i in range(4) if owner[i] == r]
        alone = sample(bb, [prompts[i] for i in mine], 2, p, seeds=[seeds[i] for i in mine], conditioning=_runs(bb, kind)[r],
                       read_states=runs[r].model if read else None)
        for i, gs in zip(mine, alone):
            for a, b in zip(together[i], gs):
                assert a.token_ids == b.token_ids and a.spans == b.spans
                torch.testing.assert_close(a.states, b.states)
                torch.testing.assert_close(a.log_actions, b.log_actions)
                assert a.encoded == b.encoded
    with pytest.raises(ValueError, match="one kind"):
        LockstepConditioning([runs[0], Conditioning()], [0, 1])
