"""bench/common.py's write_result: a stored result is written whole or not at all, and never with NaN."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from common import write_result  # noqa: E402


def test_a_result_is_written_whole_and_a_failure_leaves_the_old_one(tmp_path, monkeypatch):
    out = tmp_path / "r" / "result.json"
    write_result({"a": 1.5}, str(out))
    assert json.loads(out.read_text()) == {"a": 1.5}
    with pytest.raises(ValueError):
        write_result({"a": float("nan")}, str(out))  # refused before the file is touched
    with pytest.raises(TypeError):
        write_result({"a": object()}, str(out))  # cannot be serialised: the old result stays
    assert json.loads(out.read_text()) == {"a": 1.5} and list(out.parent.iterdir()) == [out]


@pytest.mark.parametrize("res, field", [({"a": {"b": [1.0, float("nan")]}}, "a.b[1] is nan"),
                                        ({"kappa": float("inf")}, "kappa is inf"), ({"x": [{"y": -float("inf")}]}, "x[0].y")])
def test_a_non_finite_number_is_refused_naming_its_field_and_nothing_is_written(tmp_path, res, field):
    out = tmp_path / "result.json"
    with pytest.raises(ValueError, match="result.json: ") as e:
        write_result(res, str(out))
    assert field in str(e.value) and "nothing written" in str(e.value) and not out.exists()


def test_a_replaced_file_is_the_old_one_or_the_new_one_never_half(tmp_path, monkeypatch):
    from common import replace_file

    out = tmp_path / "d" / "measured.json"
    replace_file(out, "old")
    real = os.fsync

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        replace_file(out, "new")
    monkeypatch.setattr(os, "fsync", real)
    assert out.read_text() == "old" and [p.name for p in out.parent.iterdir()] == ["measured.json"]
    replace_file(out, "new")
    assert out.read_text() == "new"


def test_write_json_refuses_a_numpy_nan_and_keeps_the_last_whole_file(tmp_path):
    import numpy as np
    from common import write_json

    out = tmp_path / "measured.json"
    write_json(out, {"rows": 160, "device": Path("/dev/x")}, default=str)
    with pytest.raises(ValueError, match=r"measured.json: b\[0\].tokens_per_s is nan"):
        write_json(out, {"b": [{"tokens_per_s": np.float32("nan")}]}, default=str)
    assert json.loads(out.read_text()) == {"rows": 160, "device": "/dev/x"}
