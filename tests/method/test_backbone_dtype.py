"""backbone.dtype auto: on a CPU a GEMM probe picks bfloat16 only where it is
measured >= 1.2x faster; the choice and the probe's numbers are recorded. Nothing here is timed: the
probe's timing function is injected."""
import hashlib
import json
import logging

import pytest
import torch

import ctrls.method.backbone as bbmod
from ctrls.config.schema import ConfigError, load_config, save_config
from ctrls.report.provenance import provenance


def fake_timer(gflops: dict, calls: list | None = None):
    """time_fn for probe_gemm: one n x n product at the given GFLOP/s per dtype."""
    def time_fn(dtype, n):
        if calls is not None:
            calls.append((dtype, n))
        return 2 * n ** 3 / (gflops[dtype] * 1e9)
    return time_fn


def probe_at(fp32: float, bf16: float) -> bbmod.GemmProbe:
    return bbmod.probe_gemm(fake_timer({torch.float32: fp32, torch.bfloat16: bf16}))


@pytest.mark.parametrize("fp32, bf16, picked", [
    (100.0, 400.0, "bfloat16"),  # clearly faster
    (100.0, 120.0, "bfloat16"),  # exactly the margin
    (100.0, 119.0, "float32"),  # faster, but not by the margin
    (100.0, 100.0, "float32"),
    (200.0, 5.0, "float32"),  # a CPU without fast bf16 kernels
])
def test_the_probe_picks_bf16_only_where_measured_faster_by_the_margin(fp32, bf16, picked):
    p = probe_at(fp32, bf16)
    assert (p.fp32_gflops, p.bf16_gflops) == pytest.approx((fp32, bf16))
    choice = bbmod.resolve_dtype("auto", "cpu", probe=lambda: p)
    assert choice.dtype == picked and choice.torch_dtype == getattr(torch, picked) and choice.probe == p


def test_the_probe_grows_the_size_until_a_product_takes_long_enough_then_takes_the_best_of_three():
    calls = []
    # fp32 at 1 GFLOP/s: 2 * 256^3 flops take 34 ms >= 20 ms, so fp32 stops at n = 256; bf16 at 1000 GFLOP/s reaches the cap
    p = bbmod.probe_gemm(fake_timer({torch.float32: 1.0, torch.bfloat16: 1000.0}, calls))
    assert (p.fp32_n, p.bf16_n) == (256, bbmod.PROBE_MAX_N)
    assert [n for dt, n in calls if dt == torch.float32] == [128, 256, 256, 256]
    assert [n for dt, n in calls if dt == torch.bfloat16] == [128, 256, 512, 1024, 1024, 1024]
    # each first product takes >= 20 ms: no growth; the best of 3 per dtype, the first included
    # (fp32: 0.5, 0.5, 0.5; bf16: 0.25, 0.9, 0.5)
    noisy = iter([0.5, 0.5, 0.5, 0.25, 0.9, 0.5])
    p = bbmod.probe_gemm(lambda dt, n: next(noisy))
    assert p.fp32_n == 128 and p.fp32_gflops == pytest.approx(2 * 128 ** 3 / 0.5 / 1e9, rel=1e-3)
    assert p.bf16_gflops == pytest.approx(2 * 128 ** 3 / 0.25 / 1e9, rel=1e-3)  # the best of (0.25, 0.9, 0.5)


def test_auto_on_cuda_and_the_other_values_do_not_probe():
    def no_probe():
        raise AssertionError("probed")
    assert bbmod.resolve_dtype("auto", "cuda", probe=no_probe).dtype == "bfloat16"
    assert bbmod.resolve_dtype("device", "cpu", probe=no_probe).dtype == "float32"
    assert bbmod.resolve_dtype("device", "cuda", probe=no_probe).dtype == "bfloat16"
    assert bbmod.resolve_dtype("bfloat16", "cpu", probe=no_probe).dtype == "bfloat16"
    with pytest.raises(bbmod.BackboneError, match="use device, auto, float32"):
        bbmod.resolve_dtype("fp8", "cpu")


def test_the_cpu_profiles_stay_float32_without_a_probe(monkeypatch):
    monkeypatch.setattr(bbmod, "machine_probe", lambda: pytest.fail("the default probed"))
    for profile in ("demo", "smoke"):
        cfg = load_config(profile, ["backbone.device=cpu"])
        assert cfg.backbone.dtype == "device" and cfg.dtype_choice().dtype == "float32"


def test_the_config_accepts_auto_and_refuses_garbage_naming_the_values():
    assert load_config("smoke", ["backbone.dtype=auto"]).backbone.dtype == "auto"
    for bad in ("fp33", "bf16", "Auto"):
        with pytest.raises(ConfigError) as e:
            load_config("smoke", {"backbone.dtype": bad})
        msg = str(e.value)
        assert f"'backbone.dtype': '{bad}' is not allowed" in msg and "auto (bfloat16 on CUDA; on a CPU" in msg, msg
        assert "device (bfloat16 on CUDA, float32 elsewhere)" in msg and "float16" in msg, msg
    with pytest.raises(ConfigError, match="'backbone.dtype': expected str, got 16"):
        load_config("smoke", {"backbone.dtype": 16})


@pytest.fixture
def probed(monkeypatch):
    """auto resolves, on any machine, to bfloat16 by a probe of fp32 100 / bf16 400 GFLOP/s."""
    p = probe_at(100.0, 400.0)
    monkeypatch.setattr(bbmod, "machine_probe", lambda: p)
    return p


RECORD = "dtype auto -> bfloat16 (probe: fp32 100.0 GFLOP/s, bf16 400.0 GFLOP/s"


def test_the_choice_and_the_probe_are_recorded_in_config_yaml_and_the_banner(probed, tmp_path):
    cfg = load_config("smoke", ["backbone.dtype=auto", "backbone.device=cpu"])
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert f"# backbone.{RECORD}" in text
    assert "bfloat16 (`backbone.dtype: auto`, by a probe: fp32 100.0 GFLOP/s, bf16 400.0 GFLOP/s)" in provenance(cfg)
    plain = load_config("smoke", ["backbone.device=cpu"])
    save_config(plain, tmp_path / "plain.yaml")
    assert "#" not in (tmp_path / "plain.yaml").read_text()  # the default's file is as before
    assert "float32 (`backbone.dtype: device`, the device's default)" in provenance(plain)
    assert "->" not in provenance(plain)


def test_load_backbone_uses_and_logs_the_choice(probed, tiny_llama, tmp_path, caplog):
    tiny_llama.model.save_pretrained(tmp_path)
    tiny_llama.tokenizer.save_pretrained(tmp_path)
    with caplog.at_level(logging.INFO, logger="ctrls.method.backbone"):
        bb = bbmod.load_backbone(str(tmp_path), device="cpu", dtype="auto")
    assert bb.dtype == torch.bfloat16 and bb.dtype_choice.probe == probed
    assert RECORD in caplog.text
    assert bbmod.load_backbone(str(tmp_path), device="cpu").dtype == torch.float32  # the default


def test_stage_keys_keep_the_default_and_hash_what_auto_resolved_to(monkeypatch):
    cfg = load_config("demo")
    old = cfg.to_dict()
    old["backbone"]["dtype"] = "auto"  # the default's name before auto measured: earlier runs keep their keys
    assert cfg.fingerprint() == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    auto = load_config("demo", ["backbone.dtype=auto", "backbone.device=cpu"])
    keys = {}
    for fp32, bf16 in ((100.0, 400.0), (100.0, 50.0)):
        monkeypatch.setattr(bbmod, "machine_probe", lambda p=probe_at(fp32, bf16): p)
        keys[auto.dtype_choice().dtype] = auto.fingerprint("backbone.dtype")
    assert set(keys) == {"bfloat16", "float32"} and len(set(keys.values())) == 2
    assert cfg.fingerprint("backbone.dtype") not in keys.values()


def test_the_machine_probe_runs_once_and_is_kept_on_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("CTRLS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(bbmod, "_PROBES", {})
    runs, p = [], probe_at(100.0, 400.0)
    monkeypatch.setattr(bbmod, "probe_gemm", lambda: runs.append(1) or p)
    first = bbmod.machine_probe()
    monkeypatch.setattr(bbmod, "_PROBES", {})  # a new process: reads the file
    assert bbmod.machine_probe() == first and len(runs) == 1
    assert bbmod.probe_file().parent == tmp_path and first.bf16_gflops == 400.0
