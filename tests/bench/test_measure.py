"""bench/gpu/gpuest/measure.py: a measurement holding a NaN is stored as an error naming its field, never as a NaN."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

for _p in ("bench", "bench/gpu"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / _p))
from common import write_json  # noqa: E402
from gpuest.measure import guarded  # noqa: E402


def test_a_measurement_with_a_nan_is_kept_as_an_error_naming_its_field(tmp_path, capsys):
    res = {}
    r = guarded(res, "ctrls_rl", lambda: {"rows": 8, "tokens_per_s": float("nan")})
    assert set(r) == {"error", "traceback"} and "ctrls_rl: tokens_per_s is nan" in r["error"]
    guarded(res, "base_rl", lambda: {"rows": 8, "tokens_per_s": 120.5})
    out = tmp_path / "measured.json"
    write_json(out, {"backbones": {"b": res}}, default=str)  # what save() writes after each measurement
    back = json.loads(out.read_text())["backbones"]["b"]
    assert back["base_rl"] == {"rows": 8, "tokens_per_s": 120.5} and "error" in back["ctrls_rl"]


def test_an_infinity_in_a_nested_record_is_an_error_too():
    res = {}
    guarded(res, "graph_ctrls_rl", lambda: {"engine": {"tokens_per_s": 1.0}, "static": {"tokens_per_s": float("inf")}})
    assert "graph_ctrls_rl: static.tokens_per_s is inf" in res["graph_ctrls_rl"]["error"]
    with pytest.raises(KeyError):
        res["graph_ctrls_rl"]["speedup"]
