"""The stored test-seed results are read with their n and intervals, and refused when a number is wrong."""
import json

import pytest

from ctrls.report.mechanism import seeds_frame, seeds_view, state_prompt_frame, state_prompt_view


def kappa(k=0.1, lo=0.03, hi=0.17, p=0.01):
    return {"kappa": k, "kappa lo": lo, "kappa hi": hi, "follows": 0.31, "null": 0.25, "p_value": p, "steps": 678,
            "questions": 60}


def seed(s, **kw):
    return {"data_seed": s, "questions": 60, "kappa": kappa(**kw),
            "harm_fixed_minus_base_pass1": {"diff": -0.02, "lo": -0.07, "hi": 0.03, "non_inferior": False},
            "eps_minus_base_pass_n": {"diff": 0.05, "lo": -0.05, "hi": 0.15, "p": 0.3}}


def write(tmp_path, d, name="seeds.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def test_seeds_are_read_with_n_intervals_and_a_pooled_row(tmp_path):
    p = write(tmp_path, {"commit": "abc", "margin_points": 5, "seeds": [seed(1), seed(2, p=0.04)], "pooled_kappa": kappa()})
    t = seeds_frame(p)
    assert list(t["data seed"]) == [1, 2, "pooled"] and t.steps.iloc[0] == 678
    assert t["p (Holm)"].iloc[:2].tolist() == pytest.approx([0.02, 0.04])
    v = seeds_view(t)
    assert (v["κ [95%]"].iloc[0] == "0.10 [0.03, 0.17]"
            and v["fixed s0 − Base pass@1 (pts)"].iloc[0] == "−2.0 [−7.0, +3.0]")  # the book's minus sign


@pytest.mark.parametrize("bad,field", [({"kappa": float("nan")}, "NaN"), ({"k": 0.5, "lo": 0.6, "hi": 0.7}, "interval"),
                                      ({"p": 1.5}, "p_value")])
def test_a_wrong_number_is_refused_naming_the_file(tmp_path, bad, field):
    kw = {k: v for k, v in bad.items() if k in ("k", "lo", "hi", "p")}
    s = seed(1, **kw)
    if "kappa" in bad:
        s["kappa"]["kappa"] = bad["kappa"]
    p = tmp_path / "seeds.json"
    p.write_text(json.dumps({"margin_points": 5, "seeds": [s], "pooled_kappa": kappa()}).replace("NaN", "NaN"))
    with pytest.raises(ValueError, match="seeds.json") as e:
        seeds_frame(p)
    assert field in str(e.value)


def test_state_prompt_runs_are_compared_with_holm(tmp_path):
    d = {"data_seed": 1, "vectors_per_state": 2, "commit": "abc",
         "state_prompt": {**kappa(0.5, 0.4, 0.6), "pass1": 0.2, "by_step": {"step 1": {"kappa": 0.7}}},
         "adapter": {**kappa(), "pass1": 0.25},
         "state_prompt_minus_adapter": {"diff": 0.4, "lo": 0.25, "hi": 0.55, "p_value": 0.001}}
    sp = write(tmp_path, d, "state_prompt_seed1.json")
    seeds = write(tmp_path, {"seeds": [{**seed(1), "pass1": {"Base": 0.225}}, {**seed(2), "pass1": {"Base": 0.4}}]}, "seeds.json")
    t = state_prompt_frame([sp], seeds=seeds)
    assert t["Δκ"].iloc[0] == 0.4 and t["κ step 1"].iloc[0] == 0.7 and t["p (Holm)"].iloc[0] == 0.001
    assert t["Base pass@1"].iloc[0] == 0.225  # Base on the same seed, beside the two variants
    assert state_prompt_view(t)["pass@1 Base (%)"].iloc[0] == "22.5"
    assert state_prompt_view(t)["state prompt κ step 1"].iloc[0] == "0.70"  # two decimals, as the κ columns
    alone = state_prompt_frame([sp], seeds=tmp_path / "absent.json")  # no seeds result: a dash, never "nan"
    assert alone["Base pass@1"].isna().all() and state_prompt_view(alone)["pass@1 Base (%)"].iloc[0] == "—"


def test_the_development_seed_is_shown_beside_outside_the_pool_and_holm(tmp_path):
    from ctrls.report.mechanism import steering_sentences

    p = write(tmp_path, {"margin_points": 5, "seeds": [seed(1), seed(2, p=0.04)], "pooled_kappa": kappa(),
                         "development": [seed(0, k=0.14, lo=0.06, hi=0.21, p=0.001)]})
    t = seeds_frame(p)
    assert list(t["data seed"]) == [1, 2, "pooled", "0 (development)"]
    assert t["p (Holm)"].iloc[:2].tolist() == pytest.approx([0.02, 0.04])  # Holm over the two fresh seeds only
    assert seeds_view(t)["κ [95%]"].iloc[3] == "0.14 [0.06, 0.21]"
    s = steering_sentences(t)
    assert s[0].startswith("On validation data seeds 1 and 2") and "excludes 0 on 2 of 2 seeds" in s[1]
    assert any("0 (development)" in x and "[0.06, 0.21]" in x for x in s)


def test_the_sentences_carry_n_and_intervals(tmp_path):
    from ctrls.report.mechanism import steering_sentences

    pooled = {**kappa(), "questions": 120, "steps": 1356}
    p = write(tmp_path, {"margin_points": 5, "seeds": [seed(1), seed(2, k=0.05, lo=-0.02, hi=0.12)], "pooled_kappa": pooled})
    s = steering_sentences(seeds_frame(p))
    assert "120 test questions" in s[0] and "1356 steps" in s[0] and "[0.03, 0.17]" in s[0]
    assert "excludes 0 on 1 of 2 seeds" in s[1]
    assert all(len(x.split()) <= 80 for x in s)


def test_the_stage_option_is_held_against_the_bar_and_says_by_how_much_it_misses(tmp_path):
    from ctrls.report.mechanism import stage_option_frame, stage_option_sentence, steering_table

    met = seed(6, k=0.55, lo=0.42, hi=0.66)
    met["harm_fixed_minus_base_pass1"] = {"diff": 0.01, "lo": -0.04, "hi": 0.06, "non_inferior": True}
    p = write(tmp_path, {"commit": "abc", "margin_points": 5, "overrides": ["state_prompt.use=true"],
                         "seeds": [met, seed(7, k=0.46, lo=0.28, hi=0.6)], "pooled_kappa": kappa()})
    s = stage_option_sentence(stage_option_frame(p))
    first, second = s.split("With ")[1:]
    assert ("data seed 6" in first and "0.55 [0.42, 0.66]" in first and "meets the steering criterion" in first
            and "non-inferior at 5" in first)
    assert "+1.0 [−4.0, +6.0] points" in first
    assert "κ is 0.040 short of 0.5" in second and "lower bound is 0.020 short of 0.3" in second and "not shown" in second
    assert "its estimate is within 5 points" in second and "its estimate" not in first  # −2.0 [−7.0, +3.0]
    assert ("Pooled over the 2 seeds (60 questions, 678 steps)" in second
            and "0.10 [0.03, 0.17], short of the steering criterion." in second)
    assert "gives an answer" not in s  # stored without answer rates (older results): no reason given
    bad = seed(8, k=0.63, lo=0.57, hi=0.7)
    bad["harm_fixed_minus_base_pass1"] = {"diff": -0.1625, "lo": -0.229, "hi": -0.1, "non_inferior": False}
    bad |= {"max_steps": 8, "valid": {"Base": 0.829, "fixed s0": 0.188, "eps=0.1": 0.98},
            "ran_all_steps": {"Base": 0.0, "fixed s0": 0.51, "eps=0.1": 0.0}}
    fine = {**met, "max_steps": 8, "valid": bad["valid"], "ran_all_steps": bad["ran_all_steps"]}
    two = write(tmp_path, {"commit": "abc", "margin_points": 5, "overrides": ["state_prompt.use=true"], "seeds": [fine, bad],
                           "pooled_kappa": kappa()}, "two.json")
    a, b = stage_option_sentence(stage_option_frame(two)).split("With ")[1:]
    assert "On seed 8 the row held at s₀ gives an answer in 18.8% of its chains against Base's 82.9%, and 51.0% run all 8" in b
    assert "gives an answer" not in a  # within the margin: no reason needed
    none = tmp_path / "absent.json"
    row = steering_table(none, [], two, none)
    assert "| the state prompt through the stages | confirmation data seeds 6 and 8 | 0.10 [0.03, 0.17] | 60 | 678 | no |" in row
    one = write(tmp_path, {"commit": "abc", "margin_points": 5, "overrides": ["state_prompt.use=true"], "seeds": [met],
                           "pooled_kappa": kappa()}, "one.json")
    t = stage_option_frame(one)
    assert list(t["data seed"]) == [6] and t.attrs["commit"] == "abc"  # one seed: no pooled row repeating it
    q = write(tmp_path, {"margin_points": 5, "overrides": [], "seeds": [met], "pooled_kappa": kappa()}, "plain.json")
    with pytest.raises(ValueError, match="plain.json.*state_prompt.use=true"):
        stage_option_frame(q)


def test_the_position_mask_result_is_read_with_its_masks_and_refused_without_them(tmp_path):
    from ctrls.report.mechanism import position_mask_frame, position_mask_view, stage_option_sentence, steering_table

    mask = {"allowed": [[0, 1, 1], [1, 0, 1]], "mode": [1, 0], "counts": [[0, 30, 5], [40, 1, 9]]}
    s6 = {**seed(6, k=0.6, lo=0.5, hi=0.7), "position_masks": {"smollm2__word_problems": mask}}
    over = ["state_prompt.use=true", "grid.position_floor=0.05"]
    p = write(tmp_path, {"commit": "abc", "margin_points": 5, "overrides": over, "seeds": [s6], "pooled_kappa": kappa()})
    t = position_mask_frame(p)
    assert t.attrs["floor"] == 0.05 and list(t["data seed"]) == [6]
    assert stage_option_sentence(t, lead="With the mask").startswith("With the mask on confirmation data seed 6")
    v = position_mask_view(t)
    assert v.position.tolist() == ["step 1", "step 2+"] and v["training steps"].tolist() == [35, 50]
    assert v["state 0"].tolist() == ["0", "40 ✓"] and v["state 1"].tolist() == ["30 ✓", "1"]
    note = steering_table(tmp_path / "absent.json", [], tmp_path / "absent.json", p)
    assert ("| the same, with the position mask (floor 0.05) | confirmation data seed 6 | 0.60 [0.50, 0.70] | 60 | 678 | "
            "yes |") in note
    for bad_over, what in ((["state_prompt.use=true"], "position_floor"),
                           (over[:1] + ["grid.position_floor=0"], "position_floor")):
        q = write(tmp_path, {"margin_points": 5, "overrides": bad_over, "seeds": [s6], "pooled_kappa": kappa()}, "q.json")
        with pytest.raises(ValueError, match=what):
            position_mask_frame(q)
    q = write(tmp_path, {"margin_points": 5, "overrides": over, "seeds": [seed(6)], "pooled_kappa": kappa()}, "nomask.json")
    with pytest.raises(ValueError, match=r"nomask.json: .*seeds\[0\]\.position_masks: missing"):
        position_mask_frame(q)
    bad = {**s6, "position_masks": {"x": {**mask, "allowed": [[1, 1]]}}}
    q = write(tmp_path, {"margin_points": 5, "overrides": over, "seeds": [bad], "pooled_kappa": kappa()}, "shape.json")
    with pytest.raises(ValueError, match="shape.json: .*allowed: not of the shape of 'counts'"):
        position_mask_frame(q)


def test_eps_minus_fixed_is_shown_per_seed_and_counted_by_its_interval(tmp_path):
    from ctrls.report.mechanism import stage_option_frame, stage_option_sentence

    a, b, c = seed(6), seed(7), seed(8)
    a["eps_minus_fixed_pass1"] = {"diff": 0.058, "lo": -0.025, "hi": 0.146}
    b["eps_minus_fixed_pass1"] = {"diff": -0.275, "lo": -0.3875, "hi": -0.1667}  # c: stored without it
    p = write(tmp_path, {"commit": "abc", "margin_points": 5, "overrides": ["state_prompt.use=true"],
                         "seeds": [a, b, c], "pooled_kappa": kappa()})
    t = stage_option_frame(p)
    v = seeds_view(t)
    assert v["ε − fixed s0 pass@1 (pts)"].tolist()[:3] == ["+5.8 [−2.5, +14.6]", "−27.5 [−38.8, −16.7]", "—"]
    s = stage_option_sentence(t)
    assert "+5.8 [−2.5, +14.6] points on seed 6, −27.5 [−38.8, −16.7] points on seed 7: the" in s
    assert "win on 0 and lose on 1 of 2" in s
    with pytest.raises(ValueError, match="eps_minus|diff|lo|hi|interval"):
        b["eps_minus_fixed_pass1"] = {"diff": 0.5, "lo": -0.1, "hi": 0.1}  # the estimate outside its interval
        stage_option_frame(write(tmp_path, {"margin_points": 5, "overrides": ["state_prompt.use=true"],
                                            "seeds": [b], "pooled_kappa": kappa()}, "bad.json"))


def test_the_adapter_comparison_is_read_per_seed_with_holm_and_refused_when_the_variants_differ_otherwise(tmp_path):
    from ctrls.report.mechanism import with_adapter_frame, with_adapter_sentence, with_adapter_view

    mine = {**seed(8, k=0.7, lo=0.6, hi=0.8), "pass1": {"Base": 0.2, "fixed s0": 0.5, "eps=0.1": 0.35}}
    vs = {"data_seed": 8, "kappa_other": kappa(0.66, 0.57, 0.73), "pass1_other": {"Base": 0.2, "fixed s0": 0.6, "eps=0.1": 0.3},
          "kappa_diff": {"diff": 0.04, "lo": -0.02, "hi": 0.1, "p_value": 0.2, "p_holm": 0.4},
          "eps_pass1_diff": {"diff": 0.05, "lo": 0.01, "hi": 0.09, "p": 0.01, "p_holm": 0.02}}
    over = ["state_prompt.use=true", "grid.position_floor=0.05", "state_prompt.with_adapter=true"]
    d = {"commit": "abc", "margin_points": 5, "overrides": over, "seeds": [mine], "pooled_kappa": kappa(),
         "against": {"overrides": over[:2], "seeds": [vs]}}
    t = with_adapter_frame(write(tmp_path, d))
    assert t["κ"].tolist() == [0.7] and t["κ alone"].tolist() == [0.66] and t["ε pass@1 alone"].tolist() == [0.3]
    v = with_adapter_view(t)
    assert v["Δκ [95%]"].iloc[0] == "+0.04 [−0.02, +0.10]" and v["Δ ε pass@1 (pts)"].iloc[0] == "+5.0 [+1.0, +9.0]"
    assert v["Δκ p (Holm)"].iloc[0] == "0.4" and v["steps (with / alone)"].iloc[0] == "678 / 678"
    said = with_adapter_sentence(t)
    assert "+0.04" in said and "raised on 0, lowered on 0" in said and "+5.0 points (raised on 1, lowered on 0)" in said
    for bad, what in (({**d, "overrides": over[:2]}, "with_adapter=true"),
                      ({**d, "against": {"overrides": over, "seeds": [vs]}}, "against.overrides: .*with_adapter false"),
                      ({**d, "seeds": [{**mine, "data_seed": 6}]}, "seed 8 is compared but not stored"),
                      ({**d, "against": {"overrides": over[:2],
                                         "seeds": [{**vs, "kappa_diff": {**vs["kappa_diff"], "lo": 0.05}}]}},
                       "interval")):
        with pytest.raises(ValueError, match=what):
            with_adapter_frame(write(tmp_path, bad, "bad.json"))


def test_a_result_made_with_the_defaults_is_read_by_its_recorded_settings(tmp_path):
    """Since the demo's defaults are the state prompt with its mask, runs made with no override record the
    variant they used (``settings``, studies/seeds.py); the readers take it over the overrides, which are empty."""
    from ctrls.report.mechanism import position_mask_frame, stage_option_frame, stored_setting

    mask = {"allowed": [[0, 1, 1], [1, 0, 1]], "mode": [1, 0], "counts": [[0, 30, 5], [40, 1, 9]]}
    s10 = {**seed(10, k=0.57, lo=0.5, hi=0.64), "position_masks": {"smollm2__word_problems": mask}}
    on = {"state_prompt.use": True, "state_prompt.with_adapter": False, "grid.position_floor": 0.05}
    p = write(tmp_path, {"commit": "abc", "margin_points": 5, "overrides": [], "settings": on, "seeds": [s10],
                         "pooled_kappa": kappa()})
    assert position_mask_frame(p).attrs["floor"] == 0.05 and list(stage_option_frame(p)["data seed"]) == [10]
    assert stored_setting({"settings": on, "overrides": ["state_prompt.use=false"]}, "state_prompt.use") == "true"
    assert stored_setting({"overrides": ["state_prompt.use=false"]}, "state_prompt.use") == "false"  # before settings
    off = write(tmp_path, {"margin_points": 5, "overrides": [], "settings": {**on, "state_prompt.use": False},
                           "seeds": [s10], "pooled_kappa": kappa()}, "off.json")
    with pytest.raises(ValueError, match=r"off.json: .*settings: not runs with state_prompt.use=true, .*use is false"):
        stage_option_frame(off)  # the refusal names the recorded settings, not the empty overrides


def test_runs_compared_against_are_read_by_their_recorded_settings_too(tmp_path):
    """``--against`` runs made with the demo's defaults carry no overrides either: the with-adapter reader
    takes their recorded settings (the state prompt alone), and refuses them when those say otherwise."""
    from ctrls.report.mechanism import with_adapter_frame

    mine = {**seed(8, k=0.7, lo=0.6, hi=0.8), "pass1": {"Base": 0.2, "fixed s0": 0.5, "eps=0.1": 0.35}}
    vs = {"data_seed": 8, "kappa_other": kappa(0.66, 0.57, 0.73), "pass1_other": {"Base": 0.2, "fixed s0": 0.6, "eps=0.1": 0.3},
          "kappa_diff": {"diff": 0.04, "lo": -0.02, "hi": 0.1, "p_value": 0.2, "p_holm": 0.4},
          "eps_pass1_diff": {"diff": 0.05, "lo": 0.01, "hi": 0.09, "p": 0.01, "p_holm": 0.02}}
    alone = {"state_prompt.use": True, "state_prompt.with_adapter": False, "grid.position_floor": 0.05}
    d = {"commit": "abc", "margin_points": 5, "overrides": ["state_prompt.with_adapter=true"],
         "settings": {**alone, "state_prompt.with_adapter": True}, "seeds": [mine], "pooled_kappa": kappa(),
         "against": {"overrides": [], "settings": alone, "seeds": [vs]}}
    assert with_adapter_frame(write(tmp_path, d))["κ alone"].tolist() == [0.66]
    bad = {**d, "against": {"overrides": [], "settings": {**alone, "state_prompt.use": False}, "seeds": [vs]}}
    with pytest.raises(ValueError, match="against.settings: not runs with state_prompt.use=true"):
        with_adapter_frame(write(tmp_path, bad, "bad.json"))


def seeds_result(*seeds, **kw):
    return {"commit": "abc", "profile": "demo", "margin_points": 5, "seeds": list(seeds), "pooled_kappa": kappa(), **kw}


def harm(**kw):
    return {**seed(1)["harm_fixed_minus_base_pass1"], **kw}


@pytest.mark.parametrize("s, field", [
    ({**seed(1), "harm_fixed_minus_base_pass1": harm(non_inferior="false")}, "pass1.non_inferior: 'false' is not true or false"),
    ({**seed(1), "harm_fixed_minus_base_pass1": harm(diff=-0.1, lo=-0.2, hi=0.0, non_inferior=True)},
     "harm_fixed_minus_base_pass1.non_inferior: true"),
    ({**seed(1), "harm_fixed_minus_base_pass1": harm(diff=0.01, lo=-0.01, hi=0.03, non_inferior=False)},
     "_pass1.non_inferior: false"),
    ({**seed(1), "questions": -3}, "seeds[0].questions: -3 is outside"),
    ({**seed(1), "questions": 2.5}, "seeds[0].questions: 2.5 is not an integer"),
    ({**seed(1), "questions": True}, "seeds[0].questions: 'True' is not a number"),
    ({**seed(1), "data_seed": "1"}, "seeds[0].data_seed: '1' is not a number"),
    ({k: v for k, v in seed(1).items() if k != "kappa"}, "seeds[0].kappa: missing"),
    ({**seed(1), "kappa": {**kappa(), "steps": 0}}, "seeds[0].kappa.steps: 0 is outside"),
    ({**seed(1), "eps_minus_base_pass_n": {"diff": 0.3, "lo": -0.05, "hi": 0.15}}, "eps_minus_base_pass_n.diff: 0.3 is outside"),
    ({**seed(1), "max_steps": 7.5, "valid": {"Base": 0.9, "fixed s0": 0.8}, "ran_all_steps": {"fixed s0": 0.1}},
     "seeds[0].max_steps: 7.5 is not an integer"),
])
def test_a_seed_field_of_the_wrong_kind_or_a_verdict_against_its_interval_is_refused_naming_file_and_field(tmp_path, s, field):
    with pytest.raises(ValueError, match="seeds.json") as e:
        seeds_frame(write(tmp_path, seeds_result(s, seed(2))))
    assert field in str(e.value)


def test_a_data_seed_listed_twice_is_refused_and_the_profile_is_kept(tmp_path):
    with pytest.raises(ValueError, match=r"seeds.json: .*seeds\[1\]\.data_seed: data seed 1 is listed twice"):
        seeds_frame(write(tmp_path, seeds_result(seed(1), seed(1))))
    assert seeds_frame(write(tmp_path, seeds_result(seed(1), seed(2)))).attrs["profile"] == "demo"
    with pytest.raises(ValueError, match="seeds.json: .*profile: '3' is not"):
        seeds_frame(write(tmp_path, seeds_result(seed(1), seed(2), profile=3)))


def state_prompt_run(s=1, **kw):
    d = {"data_seed": s, "vectors_per_state": 2, "commit": "abc",
         "state_prompt": {**kappa(0.5, 0.4, 0.6), "pass1": 0.2, "by_step": {"step 1": {"kappa": 0.7}}},
         "adapter": {**kappa(), "pass1": 0.25},
         "state_prompt_minus_adapter": {"diff": 0.4, "lo": 0.25, "hi": 0.55, "p_value": 0.001}}
    return {**d, **kw}


@pytest.mark.parametrize("d, field", [
    (state_prompt_run(vectors_per_state=0), "vectors_per_state: 0 is outside"),
    (state_prompt_run(state_prompt={**state_prompt_run()["state_prompt"], "by_step": {"step 1": {"kappa": "high"}}}),
     "state_prompt.by_step['step 1'].kappa: 'high' is not a number"),
    ({k: v for k, v in state_prompt_run().items() if k != "adapter"}, "adapter: missing"),
])
def test_a_state_prompt_run_with_a_wrong_field_is_refused_naming_file_and_field(tmp_path, d, field):
    with pytest.raises(ValueError, match="state_prompt_seed1.json") as e:
        state_prompt_frame([write(tmp_path, d, "state_prompt_seed1.json")], seeds=tmp_path / "absent.json")
    assert field in str(e.value)


def test_one_seed_stored_in_two_state_prompt_files_is_refused(tmp_path):
    a, b = write(tmp_path, state_prompt_run(1), "a.json"), write(tmp_path, state_prompt_run(1), "b.json")
    with pytest.raises(ValueError, match=r"b.json: field 'data_seed': data seed 1 is stored in .*a.json too"):
        state_prompt_frame([a, b], seeds=tmp_path / "absent.json")


def test_a_stored_mask_position_that_allows_no_state_is_refused(tmp_path):
    from ctrls.report.mechanism import position_mask_frame

    mask = {"allowed": [[0, 1, 1], [0, 0, 0]], "counts": [[0, 30, 5], [40, 1, 9]]}
    s = {**seed(6), "position_masks": {"smollm2__word_problems": mask}}
    p = write(tmp_path, seeds_result(s, overrides=["state_prompt.use=true", "grid.position_floor=0.05"]), "empty.json")
    with pytest.raises(ValueError, match=r"empty.json: .*allowed\[1\]: position bucket 1 allows no state"):
        position_mask_frame(p)


MASKED = {"state_prompt.use": True, "state_prompt.with_adapter": False, "grid.position_floor": 0.05}
MASK = {"allowed": [[0, 1, 1], [1, 0, 1]], "counts": [[0, 30, 5], [40, 1, 9]]}


def test_only_runs_of_the_profiles_defaults_are_read_as_the_defaults(tmp_path):
    from ctrls.report.mechanism import defaults_frame

    s10 = {**seed(10), "position_masks": {"smollm2__word_problems": MASK}}
    ok = write(tmp_path, seeds_result(s10, overrides=[], settings=MASKED))
    assert list(defaults_frame(ok)["data seed"]) == [10]
    with pytest.raises(ValueError, match=r"nosuch.json: field 'profile': 'nosuch' is no profile"):
        defaults_frame(write(tmp_path, seeds_result(s10, overrides=[], settings=MASKED, profile="nosuch"), "nosuch.json"))
    for bad, what in (({"settings": {**MASKED, "state_prompt.with_adapter": True}}, "state_prompt.with_adapter is true"),
                      ({"settings": {**MASKED, "grid.position_floor": 0.1}}, "grid.position_floor is 0.1"),
                      ({"settings": MASKED, "overrides": ["rl.steps=2"]}, "overrides"),
                      ({"overrides": ["state_prompt.use=true", "grid.position_floor=0.05"]}, "overrides"),
                      ({}, "state_prompt.use is None there")):
        with pytest.raises(ValueError, match=rf"bad.json: not runs made with the demo profile's defaults.*{what}"):
            defaults_frame(write(tmp_path, seeds_result(s10, **{"overrides": [], **bad}), "bad.json"))


def test_the_adapter_comparison_is_refused_when_the_runs_differ_in_another_setting_or_profile(tmp_path):
    from ctrls.report.mechanism import with_adapter_frame

    mine = {**seed(8, k=0.7, lo=0.6, hi=0.8), "pass1": {"Base": 0.2, "fixed s0": 0.5, "eps=0.1": 0.35}}
    vs = {"data_seed": 8, "kappa_other": kappa(0.66, 0.57, 0.73), "pass1_other": {"Base": 0.2, "fixed s0": 0.6, "eps=0.1": 0.3},
          "kappa_diff": {"diff": 0.04, "lo": -0.02, "hi": 0.1, "p_value": 0.2, "p_holm": 0.4},
          "eps_pass1_diff": {"diff": 0.05, "lo": 0.01, "hi": 0.09, "p": 0.01, "p_holm": 0.02}}
    d = seeds_result(mine, overrides=[], settings={**MASKED, "state_prompt.with_adapter": True},
                     against={"overrides": [], "settings": MASKED, "profile": "demo", "seeds": [vs]})
    assert with_adapter_frame(write(tmp_path, d)).attrs["profile"] == "demo"
    for against, what in (({"settings": {**MASKED, "grid.position_floor": 0.0}}, "differ in grid.position_floor as well"),
                          ({"overrides": ["rl.steps=2"]}, "differ in rl.steps as well"),
                          ({"profile": "paper"}, "another profile"),
                          ({"seeds": [vs, vs]}, "data seed 8 is listed twice"),
                          ({"seeds": [{k: v for k, v in vs.items() if k != "kappa_diff"}]}, r"seeds\[0\]\.kappa_diff: missing")):
        bad = {**d, "against": {**d["against"], **against}}
        with pytest.raises(ValueError, match=rf"bad.json: .*{what}"):
            with_adapter_frame(write(tmp_path, bad, "bad.json"))


@pytest.mark.parametrize("change, field", [({"overrides": "state_prompt.use=true"}, "overrides: a str"),
                                           ({"overrides": [1]}, "overrides[0]: "), ({"settings": ["x"]}, "settings: a list"),
                                           ({"seeds": [1, 2]}, "seeds[0]: a int"),
                                           ({"development": {"data_seed": 0}}, "development: a dict"),
                                           ({"against": [1]}, "against: a list"),
                                           ({"against": {"overrides": 3, "seeds": []}}, "against.overrides: a int")])
def test_a_variant_field_of_the_wrong_kind_is_refused_naming_file_and_field(tmp_path, change, field):
    from ctrls.report.mechanism import position_mask_frame, stage_option_frame, with_adapter_frame

    p = write(tmp_path, {**seeds_result(seed(1), seed(2)), **change}, "kinds.json")
    for frame in (seeds_frame, stage_option_frame, position_mask_frame, with_adapter_frame):
        with pytest.raises(ValueError, match="kinds.json") as e:
            frame(p)
        assert field in str(e.value), (frame.__name__, str(e.value))


def test_steers_needs_kappa_at_its_criterion_and_the_lower_bound_above_its_own():
    from ctrls.report import mechanism

    assert mechanism.steers(0.5, 0.31)  # at κ's criterion, lower bound above 0.3
    assert not mechanism.steers(0.49, 0.45)  # κ short, a lower bound that alone would pass
    assert not mechanism.steers(0.9, 0.3)  # a lower bound at 0.3 is not above it
