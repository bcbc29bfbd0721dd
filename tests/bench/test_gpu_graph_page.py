"""bench/gpu/gpu_graph_page.py reads its GPU result through the pages' one validating reader: a non-finite or
inverted stage hour is refused naming the file and the field, and no page is written."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from ctrls.report.stored import StoredResultError

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "gpu_estimate_measured_nvidia_h200_qwen.json"


def _page():
    spec = importlib.util.spec_from_file_location("gpu_graph_page", ROOT / "bench" / "gpu" / "gpu_graph_page.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("hours, field", [({"mean": float("nan"), "cap": 3.0}, "estimate.stages_hours['RL training'].mean"),
                                          ({"mean": 4.0, "cap": 3.0}, "estimate.stages_hours['RL training'].mean")])
def test_a_bad_stage_hour_is_refused_naming_its_field_and_no_page_is_written(tmp_path, hours, field):
    d = json.loads(RESULT.read_text())
    d["estimate"]["stages_hours"]["RL training"] = hours
    src = tmp_path / "r.json"
    src.write_text(json.dumps(d))
    with pytest.raises(StoredResultError, match="r.json: ") as e:
        _page().main(["--result", str(src), "--out", str(tmp_path / "p.md"), "--headline", str(tmp_path / "h.md")])
    assert e.value.field == field and not (tmp_path / "p.md").exists()


def test_the_committed_result_renders_the_committed_page(tmp_path, capsys):
    _page().main(["--out", str(tmp_path / "p.md"), "--headline", str(tmp_path / "h.md")])
    assert (tmp_path / "p.md").read_text() == (ROOT / "book" / "_includes" / "gpu_measured_graph.md").read_text()
