"""ctrls.stages.adapter_train (stage (f) of pretraining): each step's (s_{t-1}, s_t) pair with s_0 before a first
step, the controls' summary and table (log P per token and its paired gain over the backbone alone, by hand),
the bound's keys refused with their names, and the adapter's optimiser and step on the relaxed objective."""
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from ctrls.method.controls import CONDITIONS, ratio_interval
from ctrls.method.elbo import elbo
from ctrls.stages.adapter_train import (
    BOUND_COLUMNS,
    adapter_optimizer,
    check_bound_keys,
    controls_summary,
    controls_table,
    train_step,
    transition_pairs,
)
from ctrls.stages.collect import PretrainError
from tests.method.test_elbo import K, _adapter, _batch, small_llama  # noqa: F401 (small_llama: the fixture)


def test_controls_table_pairs_questions():
    import pandas as pd
    rows = []
    for q in range(5):
        for c in CONDITIONS:
            rows.append({"split": "heldout", "qid": f"q{q}", "condition": c, "steps": 2, "tokens": 10,
                         "logp": -10.0 - q + (2.0 if c == "posterior (soft)" else 0.0)})
    t = controls_table(pd.DataFrame(rows)).set_index("state given to the adapter")
    assert t.loc["posterior (soft)", "vs no adapter"] == pytest.approx(0.2)
    assert t.loc["posterior (soft)", "95% CI (paired)"] == "[0.200, 0.200]"  # the same gain on every question
    assert t.loc["no adapter", "log P / token"] == pytest.approx(-1.2)
    assert t.loc["no adapter", "95% CI (paired)"] == "—"  # the reference row is not compared with itself
    assert ratio_interval([1.0], [2.0], 0) != ratio_interval([1.0], [2.0], 0)  # nan: one question, no interval


def test_stage_f_bounds_every_token_and_trains_on_the_training_split_only(small_llama):
    """Stage (f)'s wiring on hand-made cached features: the held-out row sums Thm. 5.3's bound over
    every token of every held-out step, with s_0 before a first step; training batches truncate
    steps to max_tokens and hold no held-out question."""
    from ctrls.stages.pretrain import StepData, evaluate_bound, step_batches, transition_pairs

    bb = small_llama
    g = torch.Generator().manual_seed(0)
    lengths = {"q0": [3, 9], "q1": [7], "q2": [2, 5, 4]}  # one trajectory per question: its step lengths
    shards, index = [], []
    for q, (qid, lens) in enumerate(lengths.items()):
        ends = torch.tensor(lens).cumsum(0)
        spans = torch.stack([ends - torch.tensor(lens), ends], 1)
        shards.append({"qid": qid, "trajectories": [{"hidden": torch.randn(sum(lens) + 1, bb.hidden_size,
                                                                           generator=g).half(),
                                                     "targets": torch.randint(0, 512, (sum(lens),), generator=g),
                                                     "spans": spans}]})
        index += [(q, 0, t) for t in range(len(lens))]
    states = {"index": torch.tensor(index), "s_post": torch.softmax(torch.randn(len(index), K, generator=g), -1),
              "s0": torch.softmax(torch.randn(3, K, generator=g), -1)}
    prev, post = transition_pairs(states)
    data = StepData(shards, post, prev, {tuple(x): r for r, x in enumerate(index)}, {"q2"})
    ad, C, L = _adapter(bb, std=0.05)
    row = evaluate_bound(ad, bb.lm_head, C, L, data, "heldout", batch_steps=2)
    tr, rows = shards[2]["trajectories"][0], [3, 4, 5]
    s_post = states["s_post"][rows]
    ref = elbo(ad, bb.lm_head, C, tr["hidden"][:11].float(), tr["targets"], torch.tensor([0] * 2 + [1] * 5 + [2] * 4),
               s_post, torch.cat([states["s0"][2:], s_post[:-1]]), L)
    assert (row["questions"], row["steps"], row["tokens"]) == (1, 3, 11)
    assert row["elbo_per_step"] == pytest.approx(float(ref.value) / 3, rel=1e-9)
    assert row["kl_per_step"] >= row["mixture_kl_per_step"]
    train = list(step_batches(data, "train", 2, max_tokens=4, shuffle_seed=0))
    assert {q for b in train for q in b[5]} == {"q0", "q1"} and sum(len(b[1]) for b in train) == 3 + 4 + 4


def test_adapter_training_moves_the_adapter_and_never_the_backbone(tiny_qwen2):
    """Pretraining's own optimiser and step: the relaxed objective rises, every adapter tensor moves,
    the backbone's tensors stay bit-identical, and no backbone tensor is in the optimiser."""
    bb = tiny_qwen2
    _, hidden, targets, step_index, s_post, s_prev = _batch(bb, seed=2)
    ad, C, L = _adapter(bb)
    before_bb = {n: p.detach().clone() for n, p in bb.model.state_dict().items()}
    before_ad = {n: p.detach().clone() for n, p in ad.state_dict().items()}
    opt = adapter_optimizer(ad, lr=1e-2)
    in_opt = {id(p) for group in opt.param_groups for p in group["params"]}
    assert in_opt == {id(p) for p in ad.parameters()}
    assert not in_opt & {id(p) for p in bb.model.parameters()}
    losses = [train_step(ad, opt, bb.lm_head, C, L, hidden, targets, step_index, s_post, s_prev) for _ in range(20)]
    assert losses[-1] < losses[0] - 1.0 / len(targets)
    assert all(torch.equal(p, before_bb[n]) for n, p in bb.model.state_dict().items())
    assert not any(p.requires_grad for p in bb.model.parameters())
    assert all(not torch.equal(p, before_ad[n]) for n, p in ad.state_dict().items())


def test_each_steps_previous_state_is_the_step_before_or_the_questions_s0():
    # two questions: q0 with a trajectory of 3 steps, q1 with two trajectories of 2 and 1 steps
    index = torch.tensor([[0, 0, 0], [0, 0, 1], [0, 0, 2], [1, 0, 0], [1, 0, 1], [1, 1, 0]])
    s_post = torch.arange(6 * 2, dtype=torch.float32).reshape(6, 2)
    s0 = torch.tensor([[100.0, 101.0], [200.0, 201.0]])
    prev, post = transition_pairs({"index": index, "s_post": s_post, "s0": s0})
    assert torch.equal(post, s_post)
    assert prev.tolist() == [[100, 101], [0, 1], [2, 3], [200, 201], [6, 7], [200, 201]]


def test_the_controls_summary_is_log_p_per_token_and_its_paired_gain_by_hand():
    tokens, steps = [10, 20, 30], [1, 2, 3]
    logp = {"posterior (soft)": [-5.0, -20.0, -60.0], "no adapter": [-10.0, -30.0, -60.0]}  # the reference row last
    rows = [{"split": "heldout", "qid": f"q{i}", "condition": c, "steps": steps[i], "tokens": tokens[i], "logp": v[i]}
            for c, v in logp.items() for i in range(3)]
    s = controls_summary(pd.DataFrame(rows)).set_index("condition")
    assert list(s.index) == [c for c in CONDITIONS if c in logp]  # in CONDITIONS' order, whatever the input's
    assert (s.questions.tolist(), s.steps.tolist(), s.tokens.tolist()) == ([3, 3], [6, 6], [60, 60])
    assert s.loc["no adapter", "logp_per_token"] == pytest.approx(-100 / 60)
    assert s.loc["posterior (soft)", "logp_per_token"] == pytest.approx(-85 / 60)
    assert s.loc["posterior (soft)", "delta"] == pytest.approx(15 / 60)
    assert s.loc["no adapter", ["delta", "delta_lo", "delta_hi"]].tolist() == [0, 0, 0]
    gain = s.loc["posterior (soft)"]
    assert 0 <= gain.delta_lo <= gain.delta <= gain.delta_hi <= 0.5  # the per-question gains are 0.5, 0.5 and 0
    lo, hi = ratio_interval([-5.0, -20.0, -60.0], tokens, 0)
    assert (gain.lo, gain.hi) == pytest.approx((lo, hi))
    t = controls_table(pd.DataFrame(rows))
    assert t["log P / token"].tolist() == [round(-100 / 60, 3), round(-85 / 60, 3)]
    assert t["vs no adapter"].iloc[1] == 0.25
    with pytest.raises(PretrainError, match="no control rows"):
        controls_summary(pd.DataFrame(columns=list(rows[0])))


@pytest.mark.parametrize("changes,key", [({"heldout_fraction": 1.0}, "pretrain.heldout_fraction"),
                                         ({"heldout_fraction": -0.1}, "pretrain.heldout_fraction"),
                                         ({"bound_samples": 1}, "pretrain.bound_samples"),
                                         ({"bound_every": 0}, "pretrain.bound_every")])
def test_bound_keys_out_of_range_are_refused_by_name(changes, key):
    ok = {"heldout_fraction": 0.2, "bound_samples": 0, "bound_every": 1}
    check_bound_keys(SimpleNamespace(pretrain=SimpleNamespace(**ok)))
    check_bound_keys(SimpleNamespace(pretrain=SimpleNamespace(**{**ok, "bound_samples": 2})))
    with pytest.raises(PretrainError, match=rf"^{key} must be"):
        check_bound_keys(SimpleNamespace(pretrain=SimpleNamespace(**{**ok, **changes})))


def test_the_bound_history_columns_are_described():
    assert list(BOUND_COLUMNS)[:3] == ["epoch", "optimizer_steps", "split"]
    assert all(isinstance(v, str) and v for v in BOUND_COLUMNS.values())
