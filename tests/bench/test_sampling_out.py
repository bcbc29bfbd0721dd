"""bench/sampling.py writes its result through write_result: whole, printed last, a NaN refused naming its field."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_sampling", BENCH / "sampling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("rate", [1.5, float("nan")])
def test_the_result_is_written_whole_or_refused_naming_the_nan(tmp_path, monkeypatch, capsys, rate):
    bench = load_bench()
    monkeypatch.setattr(bench, "run", lambda *a, **k: {"float32_tokens_per_s": rate})
    out = tmp_path / "sampling.json"
    monkeypatch.setattr("sys.argv", ["sampling.py", "--dtype", "float32", "--out", str(out)])
    if rate == rate:
        bench.main()
        assert json.loads(out.read_text())["float32_tokens_per_s"] == 1.5
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["float32_tokens_per_s"] == 1.5
    else:
        with pytest.raises(ValueError, match="sampling.json: float32_tokens_per_s is nan"):
            bench.main()
        assert list(tmp_path.iterdir()) == []
