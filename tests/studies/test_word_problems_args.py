"""studies/word_problems.py writes its pilot whole, and refuses a NaN (the ICC of identical rates) naming its field."""
from __future__ import annotations

import json

import pytest

from tests.studies.harness import load_study


def level(icc):
    return {"difficulty": "ops1", "questions": 4, "samples": 4, "pass@1": 0.25, "pass@1 95% CI": [0.1, 0.4],
            "pass@4": 0.5, "succ": 0.9, "icc": icc, "icc (succ)": 0.0, "tokens": 10, "wall_s": 1.0, "example": "x"}


@pytest.mark.parametrize("icc", [0.2, float("nan")])
def test_the_pilot_is_written_whole_or_refused_naming_the_nan(tmp_path, monkeypatch, icc):
    study = load_study("word_problems")
    monkeypatch.setattr(study, "load_backbone", lambda *a, **k: None)
    monkeypatch.setattr(study, "measure", lambda *a, **k: level(icc))
    out = tmp_path / "pilot.json"
    monkeypatch.setattr("sys.argv", ["word_problems.py", "--levels", "ops1-max10", "--out", str(out)])
    if icc == icc:
        study.main()
        assert json.loads(out.read_text())["levels"][0]["icc"] == 0.2
    else:
        with pytest.raises(ValueError, match=r"pilot.json: levels\[0\].icc is nan"):
            study.main()
        assert list(tmp_path.iterdir()) == []
