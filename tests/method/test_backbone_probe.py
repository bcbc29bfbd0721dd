"""A stored GEMM probe is validated before ``backbone.dtype: auto`` trusts it; a
corrupt one (zero or negative rates, text, a missing or extra field) is measured again, overwritten and
the reason logged."""
import json
import logging

import pytest
import torch

import ctrls.method.backbone as bbmod


def _key():
    return f"{bbmod.cpu_model()}|{torch.get_num_threads()} threads|torch {torch.__version__}"


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("CTRLS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(bbmod, "_PROBES", {})
    runs = []
    good = bbmod.GemmProbe(fp32_gflops=100.0, bf16_gflops=2.5, fp32_n=1024, bf16_n=128, threads=1, seconds=0.4)
    monkeypatch.setattr(bbmod, "probe_gemm", lambda: runs.append(1) or good)
    return runs, good


GOOD = {"fp32_gflops": 100.0, "bf16_gflops": 2.5, "fp32_n": 1024, "bf16_n": 128, "threads": 1, "seconds": 0.4}


@pytest.mark.parametrize("bad,why", [
    ({"fp32_gflops": 0, "bf16_gflops": 0}, "fp32_gflops"),
    ({"fp32_gflops": -5.0, "bf16_gflops": -1.0}, "fp32_gflops"),
    ({"bf16_gflops": -1.0}, "bf16_gflops"),
    ({"fp32_gflops": "100"}, "fp32_gflops"),
    ({"bf16_gflops": float("nan")}, "bf16_gflops"),
    ({"bf16_gflops": float("inf")}, "bf16_gflops"),
    ({"fp32_gflops": True}, "fp32_gflops"),
    ({"fp32_n": 0}, "fp32_n"),
    ({"threads": 2.5}, "threads"),
    ({"seconds": -1}, "seconds"),
])
def test_a_corrupt_stored_probe_is_measured_again_and_overwritten(fresh, caplog, bad, why):
    runs, good = fresh
    f = bbmod.probe_file()
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({_key(): {**GOOD, **bad}, "other machine": GOOD}))
    with caplog.at_level(logging.WARNING, logger="ctrls.method.backbone"):
        p = bbmod.machine_probe()
    assert p == good and runs == [1]  # measured again: never picks bf16 from a corrupt file
    assert bbmod.resolve_dtype("auto", "cpu").dtype == "float32"
    assert why in caplog.text and str(f) in caplog.text and "measuring again" in caplog.text
    stored = json.loads(f.read_text())
    assert stored[_key()] == GOOD and stored["other machine"] == GOOD  # overwritten; the other entries kept


@pytest.mark.parametrize("text", ["[1, 2]", "not json", json.dumps({"x": 1}), ""])
def test_a_probe_file_that_is_not_a_mapping_of_probes_is_remeasured(fresh, text, caplog):
    runs, good = fresh
    f = bbmod.probe_file()
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)
    with caplog.at_level(logging.INFO, logger="ctrls.method.backbone"):
        assert bbmod.machine_probe() == good and runs == [1]
    assert json.loads(f.read_text())[_key()] == GOOD


def test_a_valid_stored_probe_is_used_without_measuring(fresh):
    runs, _ = fresh
    f = bbmod.probe_file()
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({_key(): {**GOOD, "bf16_gflops": 400.0}}))
    assert bbmod.machine_probe().bf16_gflops == 400.0 and runs == []


def test_probe_problem_names_the_field():
    assert bbmod.probe_problem(GOOD) is None
    assert "fp32_gflops" in bbmod.probe_problem({**GOOD, "fp32_gflops": 0})
    assert "missing" in bbmod.probe_problem({k: v for k, v in GOOD.items() if k != "threads"})
    assert "not a mapping" in bbmod.probe_problem([1, 2])
