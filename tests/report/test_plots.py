"""Every figure's caption names where it was drawn from, as showyourwork does: the
library call and the run file(s) it read (``ctrls.report.plots.drawn_from``), shown as ``<profile>/<stage>/...``
(or ``bench/results/...`` for a stored result), never as an absolute path. The pretraining
page's transition heatmap labels no more states than fit, upright; its KL figure, when every line is
flat, is one computed sentence instead.

The notebook check is static: each page's code cells are parsed, and every call of a figure function
must carry its provenance (``source=plots.drawn_from(...)``, or as the caption ``plots.show`` gets).
"""
from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from ctrls.report import (  # noqa: E402
    findings,
    forest,
    plots,
    synthetic_figures,
)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FIGURE_PAGES = {"01_pretraining", "02_exploration", "03_rl", "06_summary", "07_synthetic"}


def _figure_functions() -> set[str]:
    """The public functions of the figure modules that draw a figure (their source makes one)."""
    names = set()
    for mod in (plots, synthetic_figures, findings, forest):
        for name, f in inspect.getmembers(mod, inspect.isfunction):
            if f.__module__ == mod.__name__ and not name.startswith("_"):
                code = inspect.getsource(f)
                if any(m in code for m in ("plt.subplots(", "sns.relplot(", "plt.figure(")):
                    names.add(name)
    return names


FIGURES = _figure_functions()


def _calls(node, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == name]


def _figure_calls(nb: Path):
    """(cell index, call, provenance found) for each call of a figure function on a page."""
    cells = json.loads(nb.read_text())["cells"]
    for i, c in enumerate(cells):
        if c["cell_type"] != "code":
            continue
        tree = ast.parse("".join(c["source"]))
        shown = {}  # id of a figure call -> the caption plots.show gets for it
        for s in _calls(tree, "show"):
            if isinstance(s.func.value, ast.Name) and s.func.value.id == "plots" and len(s.args) >= 2:
                shown[id(s.args[0])] = s.args[1]
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in FIGURES
                    and isinstance(call.func.value, ast.Name)
                    and call.func.value.id in ("plots", "synthetic_figures", "findings")):
                continue
            source = next((k.value for k in call.keywords if k.arg == "source"), None) or shown.get(id(call))
            yield i, call, source is not None and bool(_calls(source, "drawn_from"))


def test_the_figure_functions_are_found():
    assert {"bound_curve", "transitions_and_sizes", "pass_at_k_curves", "learning_curves", "controls",
            "steering_scaling", "plot_prior", "plot_recovery", "paper_forest"} <= FIGURES


def test_every_figure_on_every_page_names_its_call_and_files():
    missing, called, pages = [], set(), set()
    for nb in NOTEBOOKS:
        for i, call, ok in _figure_calls(nb):
            called.add(call.func.attr)
            pages.add(nb.stem)
            if not ok:
                missing.append(f"{nb.name} cell {i}: {ast.unparse(call)[:90]}")
    assert not missing, "figures without a drawn_from(...) caption:\n" + "\n".join(missing)
    assert pages == FIGURE_PAGES
    assert called == FIGURES, f"figure functions no page draws: {sorted(FIGURES - called)}"


def test_no_figure_is_shown_twice():
    """A cell whose last statement is a bare figure call (or ``plots.show(...)``, which returns the
    figure) displays the figure again as the cell's result, under its caption, uncaptioned."""
    twice = []
    for nb in NOTEBOOKS:
        for i, c in enumerate(json.loads(nb.read_text())["cells"]):
            body = ast.parse("".join(c["source"])).body if c["cell_type"] == "code" else []
            last = body[-1] if body else None
            if (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
                    and isinstance(last.value.func, ast.Attribute) and last.value.func.attr in FIGURES | {"show"}):
                twice.append(f"{nb.name} cell {i}: {ast.unparse(last)[:80]}")
    assert not twice, "cells whose result is a figure already shown:\n" + "\n".join(twice)


def test_no_page_types_its_provenance_by_hand():
    for nb in NOTEBOOKS:
        for c in json.loads(nb.read_text())["cells"]:
            if c["cell_type"] == "code":
                text = "".join(c["source"])
                assert "Drawn by" not in text, (nb.name, text)


def test_the_figure_functions_take_their_provenance():
    """Each figure function that shows its own figure takes ``source`` (the others are shown by
    ``plots.show`` in the notebook, with the caption there)."""
    for mod in (plots, synthetic_figures):
        for name in FIGURES:
            f = getattr(mod, name, None)
            if f is not None and "show(" in inspect.getsource(f):
                assert "source" in inspect.signature(f).parameters, name


# ---- drawn_from --------------------------------------------------------------------------------

def test_drawn_from_shows_run_files_from_the_run_directory(tmp_path):
    run_dir = tmp_path / "runs"
    samples = run_dir / "demo" / "exploration" / "samples.parquet"
    samples.mkdir(parents=True)
    kl = run_dir / "demo" / "pretrain" / "b__d" / "transitions" / "kl_history.parquet"
    text = plots.drawn_from(plots.pass_at_k_curves, samples, run_dir=run_dir)
    assert text == "Drawn by `ctrls.report.plots.pass_at_k_curves` from `demo/exploration/samples.parquet/`."
    text = plots.drawn_from("ctrls.report.plots.bound_curve", run_dir / "demo" / "a.parquet", kl, str(run_dir / "demo" / "c"),
                            run_dir=str(run_dir))
    assert text == ("Drawn by `ctrls.report.plots.bound_curve` from `demo/a.parquet`, "
                    "`demo/pretrain/b__d/transitions/kl_history.parquet` and `demo/c`.")
    assert str(tmp_path) not in text
    # a glob pattern names a family of files (the RL curves)
    assert "`demo/rl/*/*/curve.parquet`" in plots.drawn_from("x", run_dir / "demo" / "rl" / "*" / "*" / "curve.parquet",
                                                             run_dir=run_dir)


def test_drawn_from_shows_a_stored_result_from_the_repository(tmp_path, monkeypatch):
    stored = ROOT / "studies" / "results" / "injection.json"
    assert plots.drawn_from(plots.steering_scaling, stored, run_dir=tmp_path) == \
        "Drawn by `ctrls.report.plots.steering_scaling` from `studies/results/injection.json`."
    # a relative run directory, as the notebooks' default "runs", is the working directory's
    monkeypatch.chdir(tmp_path)
    assert plots.drawn_from("f", Path("runs/demo/synthetic/curves.parquet"), run_dir="runs") == \
        "Drawn by `f` from `demo/synthetic/curves.parquet`."
    assert plots.drawn_from(synthetic_figures.plot_prior) == \
        "Drawn by `ctrls.report.synthetic_figures.plot_prior` from the configuration alone (no run file)."


def test_drawn_from_refuses_a_path_outside_the_run_directory(tmp_path):
    outside = tmp_path / "elsewhere" / "x.parquet"
    with pytest.raises(ValueError, match="neither the run directory .* nor the repository") as e:
        plots.drawn_from("f", outside, run_dir=tmp_path / "runs")
    assert str(outside) in str(e.value)
    with pytest.raises(ValueError, match="run_dir=cfg.run_dir"):
        plots.drawn_from("f", outside)  # no run directory given: only the repository's own files


def test_pretrain_files_are_the_files_the_run_reads(tmp_path, monkeypatch):
    """``plots.pretrain_file`` names, for each ``PretrainRun`` reader, the very path it reads."""
    from ctrls.stages import pretrain

    read = []

    class Read(Exception):
        pass

    def record(path, *a, **k):
        read.append(Path(path))
        raise Read

    monkeypatch.setattr(pretrain, "read_parquet", record)
    monkeypatch.setattr(pretrain, "load_checkpoint", record)
    root = tmp_path / "demo" / "pretrain" / "b__d"
    plain = pretrain.PretrainRun(root=root, checkpoint=tmp_path / "ckpt", summaries={})
    beside = pretrain.PretrainRun(root=root, checkpoint=tmp_path / "ckpt", summaries={},  # a run of another config
                                  dirs={s: root / f"{s}@k" for s in ("adapter", "states", "transitions")})
    for run in (plain, beside):
        for method in [*plots.PRETRAIN_FILES, "model"]:
            read.clear()
            with pytest.raises(Read):
                getattr(run, method)()
            assert read == [plots.pretrain_file(run, method)], method
    assert plots.pretrain_file(beside, "steps") == root / "states@k" / "steps.parquet"


# ---- the captions, in a kernel --------------------------------------------------------------------

@pytest.fixture
def kernel(monkeypatch):
    """``plots.show``/``say`` as in a notebook; returns the Markdown texts they display."""
    import IPython.display

    shown = []
    monkeypatch.setattr(plots, "_kernel", lambda: True)
    monkeypatch.setattr(plots, "_FIGURES", [0])
    monkeypatch.setattr(plots, "_PAGE", ["B2"])
    monkeypatch.setattr(IPython.display, "display",
                        lambda obj: shown.append(obj.data if isinstance(obj, IPython.display.Markdown) else obj))
    return shown


def test_the_caption_ends_with_its_provenance(kernel):
    curves = pd.DataFrame({"backbone": "b", "dataset": "d", "temperature": 0.7, "config": ["Base", "Base", "r", "r"],
                           "k": [1, 2, 1, 2], "pass_at_k": [0.1, 0.2, 0.15, 0.3]})
    source = plots.drawn_from(plots.pass_at_k_curves, ROOT / "studies" / "results" / "injection.json")
    plots.pass_at_k_curves(curves, source=source)
    captions = [s for s in kernel if isinstance(s, str)]
    assert len(captions) == 1 and captions[0].startswith("**Figure B2.1.** ") and captions[0].endswith(source)


def _history(flat: bool) -> pd.DataFrame:
    rows = []
    for split, base in (("train", 0.5), ("heldout", 0.9)):
        for epoch in range(3):
            kl = base if flat else base + 0.1 * epoch
            rows.append(dict(split=split, epoch=epoch, elbo_per_step=-20 + epoch, elbo_per_step_lo=-21 + epoch,
                             elbo_per_step_hi=-19 + epoch, relaxed_per_step=-19 + epoch, rec_per_token=-2 + epoch / 10,
                             relaxed_rec_per_token=-1.9 + epoch / 10, kl_per_step=kl, mixture_kl_per_step=kl - 0.05))
    return pd.DataFrame(rows)


def test_a_kl_figure_of_flat_lines_is_one_sentence(kernel):
    fit = pd.DataFrame({"step": [0], "kl": [0.537], "objective": ["expected_kl"]})
    source = plots.drawn_from("b", ROOT / "ctrls" / "paper.py")
    assert plots.bound_curve(_history(flat=True), fit, source=source) is None
    texts = [s for s in kernel if isinstance(s, str)]
    figures = [s for s in kernel if not isinstance(s, str)]
    assert len(figures) == 1 and texts[0].startswith("**Figure B2.1.**") and texts[0].endswith(source)
    sentence = texts[1]
    assert sentence.startswith("No figure of the bound's KL term: every one of its 4 lines is flat over the 3 ")
    assert "0.5" in sentence and "0.9" in sentence and "0.537" in sentence and "Figure" not in sentence


def test_a_kl_figure_that_moves_is_drawn_with_its_provenance(kernel):
    fit = pd.DataFrame({"step": [0], "kl": [0.537], "objective": ["expected_kl"]})
    source = plots.drawn_from("b", ROOT / "ctrls" / "paper.py")
    assert plots.bound_curve(_history(flat=False), fit, source=source) is not None
    texts = [s for s in kernel if isinstance(s, str)]
    assert [t[:16] for t in texts] == ["**Figure B2.1.**", "**Figure B2.2.**"] and all(t.endswith(source) for t in texts)


# ---- the transition heatmap ---------------------------------------------------------------------

@pytest.mark.parametrize("K", [4, 16, 64, 100])
def test_the_transition_heatmap_labels_few_upright_states(K):
    fig = plots.transitions_and_sizes(torch.randn(K, K), pd.Series(np.arange(500) % K))
    heat, bars = fig.axes[0], fig.axes[1]
    fig.canvas.draw()
    for ax, axis in ((heat, heat.yaxis), (heat, heat.xaxis), (bars, bars.xaxis)):
        labels = [t for t in axis.get_ticklabels() if t.get_text()]
        assert 2 <= len(labels) <= plots.MAX_TICKS, (K, len(labels))
        assert all(t.get_rotation() == 0 for t in labels)
        boxes = [t.get_window_extent() for t in labels]
        for a, b in zip(boxes, boxes[1:]):
            assert not a.overlaps(b), (K, a, b)
    assert [t.get_text() for t in heat.get_yticklabels()][:2] == ["0", str(plots.state_ticks(K)[1])]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_every_notebook_cell_has_a_unique_id():
    """nbformat 4.5 cells carry ids (papermill warned of a missing one, a future hard error)."""
    for nb in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        ids = [c.get("id") for c in cells]
        assert None not in ids, f"{nb.name}: cell {ids.index(None)} has no id"
        assert len(set(ids)) == len(ids), f"{nb.name}: repeated cell ids"


# ---- what the figures draw ------------------------------------------------------------------


def test_a_flat_pass_at_k_panel_is_a_sentence_and_no_row_hides_under_another(kernel):
    curves = pd.DataFrame([dict(backbone="b", dataset=d, temperature=0.7, config=c, k=k,
                                pass_at_k=(0.1 * k + (0.1 if c != "Base" else 0)) if d == "wp" else 0.0)
                           for d in ("wp", "gsm8k") for c in ("Base", "eps=0.1") for k in (1, 2)])
    fig = plots.pass_at_k_curves(curves)
    texts = [s for s in kernel if isinstance(s, str)]
    assert texts[0].startswith("Not drawn, because every row's pass@k is the same at every k: b · gsm8k · η=0.7 (0% ")
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["b · wp · η=0.7"]
    lines = [line for line in fig.axes[0].lines if len(line.get_xdata()) == 2]
    assert len({(line.get_linestyle(), line.get_marker()) for line in lines}) == 2  # Base and eps look different


def test_a_split_evaluated_at_two_epochs_is_drawn_as_points(kernel):
    from tests.report.test_plots_legibility import _history

    plots.bound_curve(_history(), None)
    first = next(s for s in kernel if not isinstance(s, str))
    train = [line for line in first.axes[0].lines if str(line.get_label()).startswith("train")]
    assert train and all(line.get_linestyle() == "None" for line in train)
    held = [line for line in first.axes[0].lines if str(line.get_label()) == "heldout: Thm. 5.3"]
    assert held[0].get_linestyle() == "-"
    caption = next(s for s in kernel if isinstance(s, str))
    assert "The train steps were evaluated at epochs 0 and 5 only, so they are drawn as points, not as a line." in caption


def test_rl_accuracy_is_in_percent_with_pooled_intervals_and_entropy_reaches_log_k(kernel):
    from tests.report.test_plots_legibility import rl_curves

    curves = rl_curves()
    fig = plots.learning_curves(curves, y="accuracy", ylabel="held-out accuracy (%)", scale=100)
    ax = fig.axes[0]
    pooled = plots.pooled_accuracy(curves[(curves.setting == "none") & (curves.kind == "eval")])
    means = [c.lines[0].get_ydata() for c in ax.containers]
    assert np.allclose(means[0], 100 * pooled.rate) and pooled.lo.lt(pooled.rate).all()
    assert ax.get_ylim()[0] == 0 and max(means[0]) > 1  # percent, as the tables
    caption = [s for s in kernel if isinstance(s, str)][-1]
    assert "pooled per question, with 95% Wilson intervals" in caption and "thin: each of the 3 seeds" in caption
    fig = plots.learning_curves(curves, y="policy_entropy", kind="train", smooth=5, reference=(np.log(4), "log K"))
    lo, hi = fig.axes[0].get_ylim()
    assert lo == 0 and hi >= np.log(4)
    assert "Dashed: log K." in [s for s in kernel if isinstance(s, str)][-1]
