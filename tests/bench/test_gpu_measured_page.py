"""The book's "Measured on an H100" section is what ``bench/gpu/gpu_measured_page.py`` renders from the stored
GPU results, and its key numbers are the results' own (read here independently of the renderer)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "bench" / "results"


def _bench(name: str):
    """A script of bench/gpu/ as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _page():
    return _bench("gpu_measured_page")


def _inputs():
    return [json.loads((RES / f).read_text()) for f in
            ("gpu_estimate_measured_nvidia_h100_80gb_hbm3.json", "graph_check_h100.json", "graph_profile_h100.json")]


def test_book_section_is_rendered_from_the_stored_results():
    text = _page().render(*_inputs())
    assert (ROOT / "book" / "_includes" / "gpu_measured_h100.md").read_text() == text + "\n"


def test_section_numbers_are_the_results():
    measured, check, prof = _inputs()
    text = _page().render(measured, check, prof)
    steps = prof["new_tokens"] - 1
    for label in ("repeat_kv", "packed"):  # the captured step's GPU time per token, before and after the fix
        rows = prof["runs"][label]["static"]["rows"]
        ms = next(r for r in rows if r["name"].startswith("## Call CompiledFxGraph"))["self_cuda_ms_per_step"]
        assert f"{ms:.1f} ms of GPU time per token" in text
        assert 0 < ms * steps
    tot = measured["estimate"]["total_hours"]
    assert f"| **total** | **{tot['mean']:.1f}** | **{tot['cap']:.1f}** |" in text
    qwen = measured["backbones"]["Qwen/Qwen2.5-3B-Instruct"]["base_b160"]
    assert f"| {qwen['tokens_per_s']:,.0f} |" in text
    t = check["timing"]
    assert f"| engine (1) | {1e3 * t['engine1']['s_per_iteration']:.1f} |" in text
    eq = check["equality"]["base"]["static_vs_graph1"]
    assert eq["all_equal"] and "gave exactly the eager static step's tokens" in text


def test_graph_section_and_headline_are_rendered_from_the_stored_h200_result():
    """The reproduce page's captured-path hours (its first paragraph and its section) are what the renderer makes
    of the stored result, and the totals are the result's own, summed here from its per-stage rows."""
    page = _bench("gpu_graph_page")
    d = json.loads((RES / "gpu_estimate_measured_nvidia_h200_qwen.json").read_text())
    inc = ROOT / "book" / "_includes"
    assert (inc / "gpu_measured_graph.md").read_text() == page.render(d) + "\n"
    assert (inc / "gpu_headline.md").read_text() == page.headline(d) + "\n"
    for key in ("estimate", "estimate_graph"):
        for bound in ("mean", "cap"):
            total = sum(r["seconds"] for r in d[key]["rows"] if r["bound"] == bound) / 3600
            assert abs(total - d[key]["total_hours"][bound]) < 1e-6 * total
            assert f"{total:.1f}" in page.headline(d)
    # the captured path's RL training rate is its own lockstep measurement, not the engine's
    rl = {key: next(r for r in d[key]["rows"] if r["stage"] == "RL training" and r["bound"] == "mean")
          for key in ("estimate", "estimate_graph")}
    b = d["backbones"]["Qwen/Qwen2.5-3B-Instruct"]
    speed = b["graph_ctrls_lockstep"]["static"]["tokens_per_s"] / b["ctrls_lockstep"]["tokens_per_s"]
    assert rl["estimate"]["batch_seconds"] / rl["estimate_graph"]["batch_seconds"] > 0.5 * speed > 1
