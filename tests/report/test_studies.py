"""ctrls.report.studies: the stored mechanism studies read into frames (sorted, provenance kept, bad files
refused naming the file), the tables and sentences made from them, and the K sweep's rule: Cohen's kappa
(follows - coincidence) / (1 - coincidence), checked by hand, picks the K that steers most among those whose
fixed-s0 row meets HARM_GOAL, or among all when none does."""
import json
import math

import numpy as np
import pytest

from ctrls.report import studies
from ctrls.report.studies import HARM_GOAL, chance_corrected, scaling_frame, steering_k, stored_results


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


def _result(follows: float = 0.3) -> dict:
    rate = {"rate": follows, "lo": follows - 0.1, "hi": follows + 0.1, "steps": 100, "questions": 10}
    ref = {"rate": 0.1, "lo": 0.05, "hi": 0.2, "steps": 90, "questions": 10}
    row = lambda g: {"fit": {"kept_epoch": 3, "optimizer_steps": 39},  # noqa: E731
                     "controls": {"gain_over_backbone": {"no adapter": 0.0, "posterior": g, "shuffled states": g / 2,
                                                         "random state": g / 3}},
                     "steering": {"follows": rate, "coincidence": ref, "pass1": 0.25, "succ": 0.9, "samples": 40}}
    return {"machine": {"cpu": "x"}, "commit": "abc1234", "n_layers": 30, "questions": 10, "samples_per_question": 4,
            "epsilon": 0.1, "train_chains": 100, "base": {"pass1": 0.2, "succ": 0.8, "samples": 40},
            "rows": {"last": row(0.3), "20": row(0.6), "0": row(0.9)}}


def test_injection_frame_reads_every_row_with_its_reference(tmp_path):
    import json

    from ctrls.report.studies import injection_frame

    p = tmp_path / "injection.json"
    p.write_text(json.dumps(_result()))
    df = injection_frame(p)
    assert list(df["injection"]) == ["last hidden state (the stages' adapter)", "output of layer 20 of 30",
                                     "input embeddings (Alg. 1)"]
    assert df["posterior"].tolist() == [0.3, 0.6, 0.9] and df["shuffled"].tolist() == [0.15, 0.3, 0.45]
    assert (df["coincidence"] == 0.1).all() and (df["Base pass@1"] == 0.2).all()
    assert df.attrs["commit"] == "abc1234" and df.attrs["questions"] == 10 and df.attrs["K"] is None
    p.write_text(json.dumps({**_result(), "n_states": 4}))
    assert injection_frame(p).attrs["K"] == 4
    bad = _result(float("nan"))
    p.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="NaN"):
        injection_frame(p)
    del bad["base"]
    p.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="not a readable"):
        injection_frame(p)


def test_kappa_is_the_share_of_what_coincidence_leaves_that_is_steered():
    f, c = np.array([0.25, 0.4, 0.1, 1.0]), np.array([0.25, 0.25, 0.2, 0.5])
    want = (f - c) / (1 - c)  # 0, 0.2, -0.125, 1
    assert chance_corrected(f, c) == pytest.approx(want)
    assert chance_corrected(f[:, None], c[None, :]).shape == (4, 4)  # broadcast like numpy
    assert isinstance(chance_corrected(0.4, 0.25), float)


def test_the_k_sweep_falls_back_to_every_k_when_none_is_harmless(tmp_path):
    def pt(K, follows, harm):
        d = {"diff": harm, "lo": harm - 0.1, "hi": harm + 0.1}
        return {**_point(64, follows), "K": K, "harm_fixed_s0": d}

    f = tmp_path / "r.json"
    f.write_text(json.dumps({"points": [pt(4, 0.3, -0.2), pt(8, 0.5, -0.3), pt(16, 0.2, -0.1)]}))
    df = scaling_frame(f)
    assert (df.harm < HARM_GOAL).all()
    best = steering_k(df)
    assert int(best.K) == 8 and best.kappa == pytest.approx((0.5 - 0.1) / 0.9)  # the largest kappa of all
    f.write_text(json.dumps({"points": [pt(4, 0.3, HARM_GOAL), pt(8, 0.5, -0.3)]}))
    assert int(steering_k(scaling_frame(f)).K) == 4  # exactly at the goal meets it


def test_stored_results_are_those_present_under_the_root_in_order(tmp_path):
    for rel in ("studies/results/b.json", "studies/results/a.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    rels = ["studies/results/b.json", "studies/results/missing.json", "studies/results/a.json"]
    assert stored_results(rels, tmp_path) == [tmp_path / "studies/results/b.json", tmp_path / "studies/results/a.json"]
    assert studies.scaling_result_paths(tmp_path) == [] and studies.concentration_result_path(tmp_path) is None


def test_a_points_fusion_is_its_own_then_its_overrides_then_linear():
    assert studies._fusion({"fusion": "mlp", "overrides": ["adapter.fusion=linear"]}) == "mlp"
    assert studies._fusion({"overrides": ["adapter.fusion=linear", "adapter.fusion=mlp"]}) == "mlp"  # the last wins
    assert studies._fusion({"overrides": ["states.n_states=4"]}) == studies._fusion({}) == "linear"
