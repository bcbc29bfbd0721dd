"""ctrls.method.controls: the conditions' states, and log P under a state against full adapted forwards."""
import math

import torch

from ctrls.method.adapter import adapted_logits
from ctrls.method.controls import CONDITIONS, control_states, step_logprobs
from tests.method.test_elbo import SPANS, _adapter, _batch, _reference_logprob, _states_at_positions

K = 4


def _states(S=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    s_post = torch.softmax(3 * torch.randn(S, K, generator=g), -1)
    s_prev = torch.softmax(torch.randn(S, K, generator=g), -1)
    s0 = torch.softmax(torch.randn(S, K, generator=g), -1)
    return s_post, s_prev, s0, torch.randn(K, K, generator=g)


def test_condition_states():
    s_post, s_prev, s0, L = _states()
    c = control_states(s_post, s_prev, s0, L, torch.Generator().manual_seed(1))
    assert set(c) == set(CONDITIONS) and c["no adapter"] is None
    hard = s_post.argmax(-1)
    assert torch.equal(c["posterior (one-hot)"].argmax(-1), hard)
    assert torch.equal(c["posterior (soft)"], s_post) and torch.equal(c["s0 every step"], s0)
    for name in ("posterior (one-hot)", "prior draw", "random state", "shuffled states"):
        assert torch.equal(c[name].sum(-1), torch.ones(6)) and set(c[name].unique().tolist()) <= {0.0, 1.0}
    # shuffled keeps the posterior's state counts
    assert torch.equal(torch.bincount(c["shuffled states"].argmax(-1), minlength=K), torch.bincount(hard, minlength=K))


def test_prior_draws_follow_the_transition_model():
    """Monte Carlo: the prior draw's frequencies equal s_{t-1} softmax(L) (a known Markov chain)."""
    n = 20000
    s_prev = torch.tensor([[0.7, 0.3, 0.0, 0.0]]).repeat(n, 1)
    L = torch.tensor([[2.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 3.0], [0.0] * 4, [0.0] * 4])
    c = control_states(torch.eye(K)[[0] * n], s_prev, s_prev, L, torch.Generator().manual_seed(0))
    freq = c["prior draw"].mean(0).double()
    want = s_prev[0].double() @ L.double().softmax(-1)
    assert torch.allclose(freq, want, atol=4 * (0.25 / n) ** 0.5)


def test_step_logprobs_equal_full_adapted_forwards(tiny_llama):
    bb = tiny_llama
    ids, hidden, targets, step_index, s_post, _ = _batch(bb, n_states=K)
    ad, C, _ = _adapter(bb, std=0.05, n_states=K)
    got = step_logprobs(ad, bb.lm_head, C, hidden, targets, step_index, s_post, chunk=5)
    with torch.no_grad():
        logits = adapted_logits(bb.model, ad, ids, _states_at_positions(ids, s_post), C)
    ref = _reference_logprob(logits, ids)
    want = torch.stack([ref[:4].sum(), ref[4:10].sum(), ref[10:].sum()])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    # no adapter: the backbone's own log-likelihood
    with torch.no_grad():
        base = _reference_logprob(bb.model(input_ids=ids).logits, ids)
    torch.testing.assert_close(step_logprobs(ad, bb.lm_head, C, hidden, targets, step_index, None),
                               torch.stack([base[:4].sum(), base[4:10].sum(), base[10:].sum()]), atol=1e-4, rtol=1e-5)
    assert len(SPANS) == 3


def test_reference_chains_have_one_answer_line():
    """Word problems' reference steps already end with the answer line: the chain must not repeat it
    (it did, which taught the adapter to write the answer twice); GSM8K-style steps get one appended."""
    import dataclasses

    from ctrls.data.problems import Problem
    from ctrls.data.word_problems import generate
    from ctrls.stages.collect import reference_steps
    wp = generate("train", 4, seed=0)[0]
    p = Problem(id="w0", question=wp["question"], answer=wp["answer"], steps=tuple(wp["steps"]), source="word_problems",
                split="train")
    steps = reference_steps(p, 12)
    assert sum(s.startswith("The answer is") for s in steps) == 1 and steps[-1] == f"The answer is {p.answer}."
    q = dataclasses.replace(p, steps=p.steps[:-1])
    assert reference_steps(q, 12) == steps


def test_step_kind_and_granularity():
    from ctrls.method.controls import granularity_table, step_kind

    assert step_kind("The answer is 7.") == "answer" and step_kind("4 + 3 = 7, so Ana has 7 cards.") == "arithmetic"
    assert step_kind("Ana starts with 4 cards.") == "statement"
    # two moves, each with its own direction, and numbers that vary within a move: K = 2 recovers
    # the moves exactly (NMI 1, purity 1); the coincidence of two equal states is 1/2
    g = torch.Generator().manual_seed(0)
    texts = [f"The answer is {i}." for i in range(20)] + [f"{i} + 1 = {i + 1}, so" for i in range(20)]
    e = torch.cat([torch.randn(20, 8, generator=g) * 0.1 + torch.eye(8)[0] * 5,
                   torch.randn(20, 8, generator=g) * 0.1 + torch.eye(8)[1] * 5])
    t = granularity_table(e, texts, ks=(2, 4)).set_index("K")
    assert t.loc[2, "NMI with move"] == 1.0 and t.loc[2, "move purity"] == 1.0 and t.loc[2, "coincidence"] == 0.5
    assert t.loc[4, "coincidence"] < 0.5


# ---- on the real backbone (the smoke run) ---------------------------------------------------------


def test_real_backbone_steps_and_prompts_keep_their_side(smoke_runs):
    """SmolLM2's top direction has two near-equal entries of opposite sign: with the old sign rule a
    third of the steps flipped into a mirror cluster. Every step's and prompt's first row of Eq. 5 now
    points the same way as their mean."""
    _, _, run = smoke_runs
    sp = torch.load(run.root / "spectral" / "spectral.pt", weights_only=True)
    d = sp["step_e"].shape[1] // run.model().config.spectral_k
    first = torch.cat([sp["step_e"][:, :d], sp["prompt_e"][:, :d]])
    assert torch.all(first @ first.mean(0) > 0)


def test_smoke_adapter_keeps_its_best_heldout_epoch_and_reports_controls(smoke_runs):
    _, _, run = smoke_runs
    a = run.summaries["adapter"]
    assert a["optimizer_steps"] >= a["epochs_run"] >= a["kept_epoch"] >= 0
    h = run.bound_history()
    held = h[h.split == "heldout"]
    assert held.epoch.tolist() == list(range(a["epochs_run"] + 1))  # evaluated after every epoch
    assert held.loc[held.elbo_per_token.idxmax(), "epoch"] == a["kept_epoch"] == h.epoch[h.kept].max()
    t = run.controls_table()
    assert t["state given to the adapter"].tolist() == list(CONDITIONS)
    assert math.isnan(t.loc[0, "vs no adapter"]) and t.loc[0, "95% CI (paired)"] == "—" and "Adam steps" in run.schedule()
