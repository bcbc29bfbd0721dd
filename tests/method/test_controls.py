"""ctrls.method.controls: the conditions' states, and log P under a state against full adapted forwards."""
import math

import numpy as np
import pytest
import torch

from ctrls.method.adapter import adapted_logits
from ctrls.method.controls import CONDITIONS, control_states, ratio_interval, step_logprobs
from ctrls.stages.pretrain import controls_table
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


def _point(chains, follows=0.3):
    d = {"diff": -0.05, "lo": -0.1, "hi": 0.0}
    return {"chains": chains, "train_questions": chains, "sources": "reference", "follows": follows,
            "follows_lo": min(0.2, follows), "follows_hi": max(0.4, follows),  # an interval that holds its estimate
            "coincidence": 0.1, "coincidence_lo": 0.05, "coincidence_hi": 0.15,
            "harm_fixed_s0": d, "harm_eps": d, "pass1": {"Base": {"rate": 0.2}}}


def test_scaling_frame_reads_sorts_and_refuses_bad_results(tmp_path):
    import json

    from ctrls.report import plots
    from ctrls.report.studies import scaling_frame

    f = tmp_path / "r.json"
    f.write_text(json.dumps({"commit": "abc", "machine": {"cpu": "x"}, "points": [_point(300), _point(75, 0.2)]}))
    df = scaling_frame(f)
    assert df.chains.tolist() == [75, 300] and df.follows.tolist() == [0.2, 0.3] and df.attrs["commit"] == "abc"
    assert plots.steering_scaling(df).axes[0].get_xscale() == "log"
    f.write_text(json.dumps({"points": [_point(75, float("nan"))]}))
    with pytest.raises(ValueError, match="NaN"):
        scaling_frame(f)
    bad = _point(75)
    del bad["coincidence"]
    f.write_text(json.dumps({"points": [bad]}))
    with pytest.raises(ValueError, match="not a readable studies/steering.py result"):
        scaling_frame(f)


def test_scaling_results_at_several_k_read_together_plot_per_k_and_name_k(tmp_path):
    """Two stored scaling results (one per K): read together, one series per K in the figure, each file's
    provenance named with its K."""
    import json

    from ctrls.report import plots
    from ctrls.report.studies import scaling_frame, scaling_provenance

    k16, k4 = tmp_path / "k16.json", tmp_path / "k4.json"
    k16.write_text(json.dumps({"commit": "aaa", "machine": {"cpu": "x"},
                               "points": [{**_point(75, 0.1), "K": 16}, {**_point(300, 0.12), "K": 16}]}))
    strong = {**_point(300, 0.45), "K": 4, "overrides": ["states.n_states=4"]}
    k4.write_text(json.dumps({"commit": "bbb", "machine": {"cpu": "y"},
                              "points": [{**_point(75, 0.2), "K": 4, "overrides": ["states.n_states=4"]}, strong]}))
    df = scaling_frame([k16, k4])
    assert list(zip(df.chains, df.K)) == [(75, 4), (75, 16), (300, 4), (300, 16)]
    assert df.attrs["commit"] == "aaa, bbb" and [s["commit"] for s in df.attrs["stored"]] == ["aaa", "bbb"]
    assert scaling_provenance(df) == ("Stored results: `k16.json` (K = 16: commit `aaa`, x, overrides none); "
                                      "`k4.json` (K = 4: commit `bbb`, y, overrides ['states.n_states=4']).")
    assert scaling_provenance(scaling_frame(k16)) == "Stored result: K = 16: commit `aaa`, x, overrides none."
    fig = plots.steering_scaling(df)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["ε row follows its state (K = 16)", "coincidence (Base) (K = 16)",
                      "ε row follows its state (K = 4)", "coincidence (Base) (K = 4)"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["75", "300"]
    with pytest.raises(ValueError, match="no result paths"):
        scaling_frame([])


def test_states_sweep_picks_the_k_that_steers_most_by_kappa_among_the_harmless(tmp_path):
    """A K sweep: kappa = (follows - coincidence) / (1 - coincidence) ranks the Ks (not the ratio, which
    favours many states)."""
    import json

    from ctrls.report.studies import chance_corrected, scaling_frame, states_view, steering_k

    def pt(K, follows, coincidence, harm=0.1):
        p = _point(64, follows)
        p.update(K=K, coincidence=coincidence, coincidence_lo=coincidence / 2, coincidence_hi=coincidence * 1.5,
                 harm_fixed_s0={"diff": harm, "lo": harm - 0.1, "hi": harm + 0.1})
        return p

    # ratio: K=16 2.5x > K=4 1.6x; kappa: K=4 0.2 > K=16 0.11; K=8 has the highest kappa but harms
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"points": [pt(16, 0.2, 0.08), pt(4, 0.4, 0.25), pt(8, 0.6, 0.15, harm=-0.2)]}))
    df = scaling_frame(f)
    assert df.K.tolist() == [4, 8, 16]
    assert chance_corrected(0.4, 0.25) == pytest.approx(0.2) and chance_corrected(0.25, 0.25) == 0
    assert math.isnan(chance_corrected(1.0, 1.0))  # nothing left to steer: kappa is undefined, as stats.agreement.kappa says
    view = states_view(df)
    assert view.K.tolist() == [4, 8, 16] and view["ratio"].tolist() == ["1.6×", "4.0×", "2.5×"]
    assert view["κ"].tolist() == ["0.20", "0.53", "0.13"]
    assert view["fixed s0 − Base (pass@1, points)"].iloc[1] == "−20.0 [−30.0, −10.0]"
    assert states_view(df.assign(follows=df.follows - 0.3))["κ"].iloc[0] == "−0.20"  # the book's minus sign
    assert int(steering_k(df).K) == 4  # K = 8 has the larger κ but its fixed-s0 row harms: not chosen


def test_fusion_comparison_pairs_each_point_with_the_sweeps_at_the_same_k(tmp_path):
    """The MLP-fusion result beside the K sweep's linear point at the same K, chains and sources: a fusion read
    from the point, from its overrides, or the profile's; kappa decides which steers more and the sentence says
    a point with no partner in the sweep is an error."""
    import json

    from ctrls.report.studies import fusion_frame, states_view

    def pt(K, follows, **kw):
        p = _point(64, follows)
        p.update(K=K, coincidence=0.25, coincidence_lo=0.2, coincidence_hi=0.3, follows_lo=follows - 0.05,
                 follows_hi=follows + 0.05, **kw)
        return p

    sweep, fus = tmp_path / "s.json", tmp_path / "f.json"
    sweep.write_text(json.dumps({"points": [pt(4, 0.4), pt(8, 0.3), pt(16, 0.2, overrides=["adapter.fusion=mlp"])]}))
    fus.write_text(json.dumps({"commit": "abc", "points": [pt(4, 0.55, fusion="mlp")]}))
    df = fusion_frame(sweep, fus)
    assert df[["K", "fusion"]].values.tolist() == [[4, "linear"], [4, "mlp"]] and df.attrs["commit"] == "abc"
    assert states_view(df)["F_u"].tolist() == ["linear", "mlp"]
    assert fusion_frame(sweep, fus.with_name("s.json")).fusion.tolist() == ["linear", "linear", "mlp"]  # overrides
    fus.write_text(json.dumps({"points": [pt(2, 0.5, fusion="mlp")]}))
    with pytest.raises(ValueError, match="no point of the K sweep"):
        fusion_frame(sweep, fus)


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


def test_concentration_frame_reads_points_and_refuses_bad_results(tmp_path):
    import json

    from ctrls.report.studies import concentration_frame

    def point(c, f):
        ctl = {"follows": f, "follows lo": f / 2, "follows hi": f * 2, "Base, random states": 0.07,
               "Base, random states lo": 0.03, "Base, random states hi": 0.2, "steps": 300}
        return {"c": c, "controllability": {"eps=0.1": ctl, "eps=0": dict(ctl, follows=f / 2)},
                "pass@1": {"Base": 0.2, "eps=0.1": 0.3, "eps=0": 0.25}, "samples": {"Base": 160, "eps=0.1": 160, "eps=0": 160}}

    f = tmp_path / "c.json"
    f.write_text(json.dumps({"fitted_c": 4.2, "points": [point(20.0, 0.1), point(1.0, 0.12)]}))
    df = concentration_frame(f)
    e = df[df.row == "eps=0.1"]
    assert e.c.tolist() == [1.0, 20.0] and e.follows.tolist() == [0.12, 0.1] and df.attrs["fitted_c"] == 4.2
    assert df[df.row == "eps=0"].follows.tolist() == [0.06, 0.05] and (df["Base pass@1"] == 0.2).all()
    f.write_text(json.dumps({"fitted_c": 4.2, "points": [point(1.0, float("nan"))]}))
    with pytest.raises(ValueError, match="NaN"):
        concentration_frame(f)
    f.write_text(json.dumps({"points": [point(1.0, 0.1)]}))
    with pytest.raises(ValueError, match="not a readable studies/concentration.py result"):
        concentration_frame(f)


def _rows():
    def rate(r, lo, hi, **kw):
        return {"rate": r, "lo": lo, "hi": hi, **kw}

    p1 = {"questions": 40, "samples": 160}
    return {"eps=1.0": {"pass1": rate(0.1, 0.05, 0.2, **p1), "succ": rate(0.5, 0.4, 0.6),
                        "follows": rate(0.06, 0.03, 0.1, steps=500), "coincidence": rate(0.06, 0.04, 0.09)},
            "Base": {"pass1": rate(0.2, 0.15, 0.29, **p1), "succ": rate(0.8, 0.7, 0.9)},
            "eps=0.1": {"pass1": rate(0.21, 0.14, 0.31, **p1), "succ": rate(0.8, 0.7, 0.9),
                        "follows": rate(0.12, 0.08, 0.17, steps=500), "coincidence": rate(0.064, 0.03, 0.12)},
            "fixed s0": {"pass1": rate(0.07, 0.03, 0.14, **p1), "succ": rate(0.37, 0.3, 0.45),
                         "follows": rate(0.3, 0.2, 0.4, steps=400), "coincidence": rate(0.1, 0.05, 0.2)},
            "eps=0.0": {"pass1": rate(0.2, 0.13, 0.3, **p1), "succ": rate(0.8, 0.7, 0.9),
                        "follows": rate(0.13, 0.09, 0.18, steps=500), "coincidence": rate(0.07, 0.04, 0.12)}}


def test_generation_frame_orders_the_conditions_and_refuses_bad_results(tmp_path):
    import json

    from ctrls.report.studies import generation_frame, generation_view

    f = tmp_path / "g.json"
    f.write_text(json.dumps({"commit": "abc", "points": [{**_point(64), "rows": _rows()}]}))
    df = generation_frame(f)
    assert df.config.tolist() == ["Base", "fixed s0", "eps=0.0", "eps=0.1", "eps=1.0"]
    assert df.condition.tolist()[2:] == ["a prior draw (eps=0.0)", "the policy's ε-greedy draw (eps=0.1)",
                                         "a uniformly random state (eps=1.0)"]
    assert np.isnan(df.follows.iloc[0]) and df.follows.iloc[3] == 0.12 and df.attrs["commit"] == "abc"
    view = generation_view(df)
    assert view["follows its state (%)"].iloc[0] == "—"
    assert view["pass@1 (%)"].iloc[1] == "7 [3, 14]" and view["by coincidence (%)"].iloc[3] == "6.4 [3.0, 12.0]"
    rows = _rows()
    rows["Base"]["pass1"]["rate"] = float("nan")
    f.write_text(json.dumps({"points": [{**_point(64), "rows": rows}]}))
    with pytest.raises(ValueError, match="NaN/Inf"):
        generation_frame(f)
    f.write_text(json.dumps({"points": [_point(64)]}))  # a scaling result without rows
    with pytest.raises(ValueError, match="not a readable studies/steering.py result with rows"):
        generation_frame(f)


def test_generation_sentences_compare_the_adapter_rows_with_base_and_each_follows_rate_with_coincidence(tmp_path):
    import json

    from ctrls.report.studies import generation_frame, generation_sentences

    f = tmp_path / "g.json"
    f.write_text(json.dumps({"points": [{**_point(64), "rows": _rows()}]}))
    style, steer = generation_sentences(generation_frame(f))
    assert style.startswith("With the adapter, pass@1 is 7.0–21.0% and Succ. 37.0–80.0% across the 4 state conditions, "
                            "against Base's 20.0% and 80.0%")
    assert "6.0% under a uniformly random state against 6.0% by coincidence" in steer
    assert steer.count("by coincidence") == 4
    assert style.endswith("80.0%.")  # fixed s0 is below Base: no claim that every condition is above it
    rows = _rows()
    for r in ("fixed s0", "eps=0.0", "eps=0.1", "eps=1.0"):  # each rate inside its interval (ctrls.report.stored)
        rows[r]["pass1"].update(rate=0.3, lo=0.2, hi=0.4)
        rows[r]["succ"].update(rate=0.9, lo=0.85, hi=0.95)
    f.write_text(json.dumps({"points": [{**_point(64), "rows": rows}]}))
    assert generation_sentences(generation_frame(f))[0].endswith(
        "whichever state it draws (the gain in pass@1 is the adapter's style, not the state's choice).")
