"""The case-study stage: the paper's case questions are decoded once (Base and CTRLS(ε), as the exploration rows
are), stored under the run directory, and read back unchanged by the next call; a missing fit is refused first."""
import shutil

import pytest


def _found():
    from ctrls.data.problems import Problem

    return {"two": Problem(id="c0", question="Tom has 3 apples and buys 4 more. How many apples?", answer="7",
                           steps=("3 + 4 = 7",), source="math", split="test")}


def test_the_cases_are_decoded_once_then_read_from_the_run(tiny_runs, tmp_path, monkeypatch):
    from ctrls.config.schema import override
    from ctrls.stages import cases

    d, cfg, _ = tiny_runs
    shutil.copytree(d, tmp_path / "runs")
    c = override(cfg, {"run_dir": str(tmp_path / "runs")})
    monkeypatch.setattr(cases, "find_paper_cases", lambda cfg: _found())
    found, df = cases.run_cases(c, progress=False)
    assert set(found) == {"two"} and set(df.case) == {"two"}
    assert df.groupby("config").size().to_dict() == {"Base": 2, f"eps={c.grid.epsilons[0]:g}": 2}  # 2 a side (smoke)
    assert (c.stage_dir("cases") / cases.SAMPLES).exists()

    def no_decode(*a, **k):
        raise AssertionError("the stored samples were decoded again")

    monkeypatch.setattr(cases, "sample_paper_cases", no_decode)
    _, again = cases.run_cases(c, progress=False)
    assert again.text.tolist() == df.text.tolist()


def test_a_missing_fit_is_refused_before_anything_is_decoded(tmp_path, tiny_model_dir, monkeypatch):
    from ctrls.config.schema import load_config
    from ctrls.stages import cases
    from ctrls.stages.collect import PretrainError
    from tests.conftest import SMOKE_OVERRIDES, tiny_overrides

    cfg = load_config("smoke", [*SMOKE_OVERRIDES, *tiny_overrides(tiny_model_dir), f"run_dir={tmp_path}"])
    monkeypatch.setattr(cases, "find_paper_cases", lambda cfg: _found())
    with pytest.raises(PretrainError, match="finished pretraining"):
        cases.run_cases(cfg, progress=False)
