"""The RL page's reader of RL under the state prompt: rows with n and intervals, Holm p, sentences that follow
the intervals, and a result of other runs or without RL rows refused by name."""
import json

import pytest

from ctrls.report.steered_rl import rl_frame, rl_sentence, steered_rl_view


def pair(diff, lo, hi, b, p=0.01):
    return {"k": 1, "questions": 60, "a": b + diff, "b": b, "diff": diff, "lo": lo, "hi": hi, "p": p, "p_holm": min(1.0, 2 * p)}


def result(rl, overrides=("state_prompt.use=true", "grid.position_floor=0.05"), seconds=None):
    seed = {"data_seed": 9, "rl_table2": rl, "stage_seconds": seconds or {"state_prompt_fit": 480.0, "rl": 600.0}}
    return {"commit": "abc", "overrides": list(overrides), "seeds": [seed]}


def write(tmp_path, d):
    p = tmp_path / "state_prompt_rl.json"
    p.write_text(json.dumps(d))
    return p


RL = {"ε=0.0, H=0.0": {"pass1": 0.30, "samples": 240, "minus_base": pair(0.11, 0.04, 0.18, 0.19),
                       "minus_pretrained_eps": pair(-0.01, -0.10, 0.08, 0.31, p=0.9)},
      "ε=0.1, H=0.01": {"pass1": 0.31, "samples": 240, "minus_base": pair(0.12, 0.05, 0.20, 0.19),
                        "minus_pretrained_eps": pair(0.00, -0.07, 0.08, 0.31, p=1.0)}}


def test_each_policy_is_shown_with_n_intervals_and_holm_and_the_sentence_follows_them(tmp_path):
    t = rl_frame(write(tmp_path, result(RL)))
    assert list(t.policy) == list(RL) and set(t["data seed"]) == {9}
    v = steered_rl_view(t)
    assert v["pass@1 (%)"].iloc[0] == "30.0 (n = 240)" and v["questions"].iloc[0] == 60
    assert v["− Base (points)"].iloc[0] == "+11.0 [+4.0, +18.0], Holm p 0.02"
    assert v["− pretrained ε (points)"].iloc[0] == "−1.0 [−10.0, +8.0], Holm p 1"
    s = rl_sentence(t)
    assert "Base answers 19.0% and the pretrained policy's ε row 31.0%" in s
    assert "2 of the 2 RL policies beat Base and 0 lose to it; 0 beat the pretrained ε row" in s
    assert "RL added none we can show" in s
    won = {**RL, "ε=0.1, H=0.01": {**RL["ε=0.1, H=0.01"], "minus_pretrained_eps": pair(0.09, 0.02, 0.16, 0.31)}}
    s = rl_sentence(rl_frame(write(tmp_path, result(won))))
    assert "1 beat the pretrained ε row" in s and "RL added none" not in s


@pytest.mark.parametrize("d, msg", [
    (result(RL, overrides=("grid.transfer_datasets=[]",)), "overrides: not runs with state_prompt.use=true"),
    (result({}), "seeds[0].rl_table2: 0 entries"),
    (result({"x": {**RL["ε=0.0, H=0.0"], "pass1": 1.5}}), "seeds[0].rl_table2.x.pass1: 1.5 is outside"),
    (result({"x": {**RL["ε=0.0, H=0.0"], "minus_base": pair(0.11, 0.12, 0.18, 0.19)}}), "minus_base|interval|lo"),
])
def test_a_result_of_other_runs_or_a_bad_number_is_refused_naming_the_file(tmp_path, d, msg):
    with pytest.raises(ValueError, match="state_prompt_rl.json") as e:
        rl_frame(write(tmp_path, d))
    assert any(m in str(e.value) for m in msg.split("|"))


@pytest.mark.parametrize("d, msg", [
    (result(RL, overrides=("state_prompt.use=true",)), "not runs with the position mask"),
    (result(RL, overrides=("state_prompt.use=true", "grid.position_floor=0")), "not runs with the position mask"),
    (result({"x": {k: v for k, v in RL["ε=0.0, H=0.0"].items() if k != "minus_pretrained_eps"}}),
     r"rl_table2.x.minus_pretrained_eps: missing"),
    (result({"x": {**RL["ε=0.0, H=0.0"], "samples": 2.5}}), r"rl_table2.x.samples: 2.5 is not an integer"),
    ({**result(RL), "seeds": result(RL)["seeds"] * 2}, "data seed 9 is listed twice"),
])
def test_runs_without_the_mask_a_missing_field_or_a_seed_twice_is_refused_naming_file_and_field(tmp_path, d, msg):
    with pytest.raises(ValueError, match=f"state_prompt_rl.json: .*{msg}"):
        rl_frame(write(tmp_path, d))


def test_the_profile_and_mask_floor_of_the_runs_are_kept_for_the_page(tmp_path):
    t = rl_frame(write(tmp_path, {**result(RL), "profile": "smoke"}))
    assert t.attrs["profile"] == "smoke" and t.attrs["floor"] == 0.05
    assert rl_frame(write(tmp_path, result(RL))).attrs["profile"] == "?"
