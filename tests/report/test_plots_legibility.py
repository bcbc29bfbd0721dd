"""The figures read at 1280 px and on a 390 px phone. The first page's forest plot groups the
paper's 80 differences into 16 labelled rows (it had 80 labels at 5.5 pt); every text of every figure is
at least ``plots.MIN_FONT_PT``; no figure is wider than the book's column; the stylesheet scales every figure
to its column, so that none is cut off on a phone.

Rendered on small made-up data, at 100 dpi as the inline backend saves them."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from ctrls.config.schema import load_config  # noqa: E402
from ctrls.report import findings, paper_power, plots, synthetic_figures  # noqa: E402
from tests.report.test_synthetic_figures import _curves, _summary  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PHONE_COLUMN_PX = 358  # the article's width in a 390 px viewport
DESKTOP_COLUMN_PX = 948


def _texts(fig):
    fig.canvas.draw()
    return [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]


def _px(fontsize_pt: float, shown_px: float, figure_px: float) -> float:
    """The height in CSS pixels of a text of ``fontsize_pt`` in a figure ``figure_px`` wide shown ``shown_px`` wide."""
    return fontsize_pt * 100 / 72 * min(1.0, shown_px / figure_px)


@pytest.fixture(scope="module")
def forest():
    fig = findings.paper_forest(paper_power.paired_p_columns(paper_power.paper_power()))
    yield fig
    plt.close(fig)


def test_the_forest_plot_groups_its_rows(forest):
    labels = [t for ax in forest.axes for t in ax.get_yticklabels() if t.get_text()]
    assert 2 <= len(labels) <= 20, len(labels)  # 16: backbone × dataset × metric per table, not 80
    assert len({t.get_text() for t in labels}) == len(labels) // 2  # the same 8 groups in both tables


def test_the_forest_plot_reads_on_a_phone_and_on_a_desktop(forest):
    width_px = forest.get_figwidth() * 100
    assert width_px <= 620  # shown at its own size at 1280 px, never downscaled
    for t in _texts(forest):
        assert t.get_fontsize() >= plots.MIN_FONT_PT, t.get_text()
        assert _px(t.get_fontsize(), PHONE_COLUMN_PX, width_px) >= 7.5, (t.get_text(), t.get_fontsize())
        assert _px(t.get_fontsize(), DESKTOP_COLUMN_PX, width_px) >= 13


def _history() -> pd.DataFrame:
    rows = []
    for split, epochs in (("train", (0, 5)), ("heldout", range(6))):
        for e in epochs:
            rows.append(dict(split=split, epoch=e, elbo_per_step=-9 + e / 2, elbo_per_step_lo=-10 + e / 2,
                             elbo_per_step_hi=-8 + e / 2, relaxed_per_step=-8.9 + e / 2, rec_per_token=-0.7 + e / 20,
                             relaxed_rec_per_token=-0.69 + e / 20, kl_per_step=0.37 + e / 100,
                             mixture_kl_per_step=0.35 + e / 100))
    return pd.DataFrame(rows)


def rl_curves() -> pd.DataFrame:
    rows = []
    rng = np.random.default_rng(0)
    for setting, seed, step in itertools.product(["none", "both"], [0, 1, 2], [0, 10, 20]):
        correct = rng.integers(0, 3, size=12).tolist()
        rows.append(dict(pair="smollm2__word_problems", setting=setting, seed=seed, step=step, kind="eval",
                         accuracy=sum(correct) / 24, correct_by_question=correct, samples_per_question=2,
                         state_usage_entropy=1.30 + rng.random() / 100, epsilon=0.1, alpha=0.0))
        for s in range(step, step + 10):
            rows.append(dict(pair="smollm2__word_problems", setting=setting, seed=seed, step=s, kind="train",
                             reward=rng.random(), policy_entropy=1.380 + rng.random() / 200, epsilon=0.1, alpha=0.0))
    return pd.DataFrame(rows)


def _figures():
    """(name, function that draws it) for every figure of the run pages."""
    cfg = load_config("demo")
    curves, summary = _curves(cfg), _summary(cfg)
    recovery = pd.DataFrame([dict(chains=n, seed=s, mean_tv=1 / np.sqrt(n), max_tv=2 / np.sqrt(n))
                             for n in (10, 100, 1000) for s in range(3)])
    pass_k = pd.DataFrame([dict(backbone="b", dataset=d, temperature=0.7, config=c, k=k,
                                pass_at_k=(0.2 + 0.1 * k + (0.1 if c != "Base" else 0)) if d == "wp" else 0.0)
                           for d in ("wp", "gsm8k") for c in ("Base", "eps=0.1") for k in (1, 2, 3, 4)])
    controls = pd.DataFrame([dict(condition=c, delta=d, delta_lo=d - 0.05, delta_hi=d + 0.05)
                             for c, d in (("no adapter", 0), ("posterior", 0.3), ("shuffled", 0.1))])
    scaling = pd.DataFrame([dict(chains=n, K=k, follows=0.3, follows_lo=0.25, follows_hi=0.35, coincidence=0.2,
                                 coincidence_lo=0.15, coincidence_hi=0.25, harm=0.0, harm_lo=-0.1, harm_hi=0.1,
                                 eps_vs_base=0.02, eps_vs_base_lo=-0.08, eps_vs_base_hi=0.12)
                            for n in (75, 300) for k in (4, 16)])
    return [
        ("bound", lambda: plots.bound_curve(_history(), None)),
        ("transitions", lambda: plots.transitions_and_sizes(torch.randn(4, 4), pd.Series(np.arange(100) % 4))),
        ("pass@k", lambda: plots.pass_at_k_curves(pass_k)),
        ("accuracy", lambda: plots.learning_curves(rl_curves(), y="accuracy", ylabel="held-out accuracy (%)", scale=100)),
        ("entropy", lambda: plots.learning_curves(rl_curves(), y="policy_entropy", kind="train", smooth=5,
                                                  reference=(np.log(4), "log K"))),
        ("controls", lambda: plots.controls(controls)),
        ("scaling", lambda: plots.steering_scaling(scaling)),
        ("synthetic curves", lambda: synthetic_figures.plot_learning_curves(curves, cfg)),
        ("synthetic entropy", lambda: synthetic_figures.plot_entropy(curves)),
        ("sweep", lambda: synthetic_figures.plot_sweep(summary)),
        ("sweep curves", lambda: synthetic_figures.plot_sweep_curves(curves, cfg)),
        ("prior", lambda: synthetic_figures.plot_prior(cfg)),
        ("recovery", lambda: synthetic_figures.plot_recovery(recovery)),
    ]


@pytest.mark.parametrize("name,draw", _figures(), ids=[n for n, _ in _figures()])
def test_every_text_is_legible_and_no_figure_is_wider_than_the_column(name, draw):
    fig = draw()
    try:
        assert fig.get_figwidth() <= plots.MAX_WIDTH_IN + 1e-9, (name, fig.get_figwidth())
        small = [(t.get_text(), t.get_fontsize()) for t in _texts(fig) if t.get_fontsize() < plots.MIN_FONT_PT]
        assert not small, (name, small)
    finally:
        plt.close(fig)


def test_the_stylesheet_scales_every_figure_to_its_column_and_scrolls_wide_math():
    """No figure is cut off or scrolls at 390 px: every image scales to the column; display math scrolls in its box."""
    css = (ROOT / "book" / "_static" / "ctrls.css").read_text()
    m = re.search(r"article img, article figure, article \.figure, div\.cell_output img \{([^}]*)\}", css)
    assert m and "max-width: 100%" in m.group(1) and "height: auto" in m.group(1)
    assert re.search(r"article mjx-container\[display=\"true\"\][^{]*\{[^}]*overflow-x: auto", css)
    assert "width: 560px" not in css and "max-width: none" not in css
    assert _px(plots.MIN_FONT_PT, DESKTOP_COLUMN_PX, plots.MAX_WIDTH_IN * 100) >= 8
