"""ctrls.stages.judge: Table 3's rows are Base then each judged policy labelled as the paper labels it; the
judged outputs are the judged pair's only, at eta = rl.temperature, Base from the RL stage when it has its
own, else from exploration (and without an RL stage the exploration rows, marked "no RL"); a policy with no
samples is refused naming the row; the judge's replies are computed once and read back unless forced."""
import pandas as pd
import pytest

import ctrls.stages.judge as J
from ctrls.config.schema import load_config

PAIR = ("smollm2-135m-instruct", "gsm8k")  # the smoke profile's one pair


def samples(configs, backbone=PAIR[0], dataset=PAIR[1], temperature=0.7, n=2):
    return pd.DataFrame([{"backbone": backbone, "dataset": dataset, "temperature": temperature, "config": c,
                          "epsilon": float("nan") if c == "Base" else 0.1, "question_id": f"q{i}", "sample_index": 0,
                          "correct": bool(i % 2)} for c in configs for i in range(n)])


@pytest.fixture
def cfg(tmp_path):
    return load_config("smoke", [f"run_dir={tmp_path}"])


def others():
    """Rows the judge must never take: another dataset, another temperature."""
    return pd.concat([samples(["Base", "eps=0.1"], dataset="math"), samples(["Base", "eps=0.1"], temperature=0.5)])


def test_table3s_rows_are_base_then_each_policy_once(cfg):
    assert J.table3_labels(cfg) == ["Base", "ε=0.1, H=0.0", "ε=0.1, H=0.01"]
    cfg.judge.settings = ["eps=0.1", "epsilon=0.1,H=0", "H=0.01"]  # two spellings of one policy
    assert J.table3_labels(cfg) == ["Base", "ε=0.1, H=0.0", "ε=0.0, H=0.01"]


def test_without_an_rl_stage_the_exploration_rows_are_judged_marked_no_rl(cfg, monkeypatch):
    monkeypatch.setattr(J, "load_samples", lambda c: pd.concat([samples(["Base", "eps=0.1"]), others()]))

    def no_rl(c):
        raise FileNotFoundError("no RL stage")

    monkeypatch.setattr(J, "load_table2_samples", no_rl)
    out = J.judged_configs(cfg)
    assert out.groupby("config").size().to_dict() == {"Base": 2, "ε=0.1, H=0 (no RL)": 2}
    assert (out.config == out.setting).all()
    assert set(out.dataset) == {"gsm8k"} and set(out.temperature) == {0.7}


def test_with_an_rl_stage_base_and_the_judged_policies_come_from_it(cfg, monkeypatch):
    rl = samples(["Base", "ε=0.1, H=0.0", "ε=0.1, H=0.01", "ε=0.3, H=0.0"], n=3)
    monkeypatch.setattr(J, "load_samples", lambda c: pd.concat([samples(["Base", "eps=0.1"]), others()]))
    monkeypatch.setattr(J, "load_table2_samples", lambda c: pd.concat([rl, others()]))
    out = J.judged_configs(cfg)
    assert out.groupby("config").size().to_dict() == {"Base": 3, "ε=0.1, H=0.0": 3, "ε=0.1, H=0.01": 3}
    assert (out.config == out.setting).all() and set(out.dataset) == {"gsm8k"}
    monkeypatch.setattr(J, "load_table2_samples", lambda c: rl[rl.config != "Base"])  # no Base of its own
    assert (J.judged_configs(cfg).query("config == 'Base'").shape[0]) == 2  # the exploration's Base
    monkeypatch.setattr(J, "load_table2_samples", lambda c: rl[rl.config != "ε=0.1, H=0.01"])
    with pytest.raises(ValueError, match=r"no RL samples for Table 3 rows \['ε=0.1, H=0.01'\] of smollm2-135m-instruct x gsm8k"):
        J.judged_configs(cfg)


class Backend:
    name, model = "fake", "fake-1"


def test_the_judge_runs_once_and_is_read_back_unless_forced(cfg, monkeypatch):
    calls = []

    def judge_samples(picked, backend, cache_dir, temperature, progress):
        calls.append(len(picked))
        return picked.assign(overall=7.0, parse="json")

    monkeypatch.setattr(J, "make_backend", lambda jc: Backend())
    monkeypatch.setattr(J, "judged_configs", lambda c: samples(["Base", "ε=0.1, H=0.0"], n=5))
    monkeypatch.setattr(J, "judge_samples", judge_samples)
    cfg.judge.samples_per_config = 3
    first = J.run_judge(cfg, progress=False)
    assert calls == [6] and first.groupby("config").size().to_dict() == {"Base": 3, "ε=0.1, H=0.0": 3}
    again = J.run_judge(cfg, progress=False)
    assert calls == [6]  # finished: read back, not judged again
    pd.testing.assert_frame_equal(again, first)
    J.run_judge(cfg, force=True, progress=False)
    assert calls == [6, 6]
