"""Issue 35, item 7: the synthetic page's figures fit the book's 948 px column at their own size
(Figure 4, the sweep, was drawn 1,372 px wide and shown downscaled) and no legend covers a curve
(Figure 3, the entropy curves). Rendered on small made-up runs, as the inline backend saves them
(100 dpi, cropped tight)."""
from __future__ import annotations

import io
import itertools

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from ctrls import synthetic  # noqa: E402
from ctrls.config import load_config  # noqa: E402

COLUMN_PX = 948  # the book's content column at 1280 px


def _curves(cfg) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    settings = dict(zip(synthetic.SETTINGS, [(0.0, 0.0), (0.1, 0.0), (0.0, 0.1), (0.1, 0.1)]))
    cells = {f"e{e}a{a}": (e, a) for e, a in itertools.product(cfg.synthetic.epsilons, cfg.synthetic.alphas)}
    for name, (e, a) in {**settings, **cells}.items():
        for seed, step in itertools.product(range(3), range(0, 20, 5)):
            for kind in ("train", "eval"):
                rows.append(dict(setting=name, seed=seed, kind=kind, step=step, epsilon=e, alpha=a,
                                 reward=rng.random(), eval_reward=min(1.0, step / 20 + rng.random() / 5),
                                 policy_entropy=2 - step / 20 + rng.random() / 5,
                                 start_entropy=2 - step / 20 + rng.random() / 5))
    return pd.DataFrame(rows)


def _summary(cfg) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame([dict(epsilon=e, alpha=a, seed=s, reward_final=rng.random(), found=bool(rng.random() > .5),
                              start_entropy_final=rng.random())
                         for e, a, s in itertools.product(cfg.synthetic.epsilons, cfg.synthetic.alphas, range(3))])


def _png_width(fig) -> int:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")  # what the inline backend does
    import struct

    return struct.unpack(">II", buf.getvalue()[16:24])[0]


@pytest.fixture(scope="module")
def figures():
    import matplotlib.pyplot as plt

    cfg = load_config("demo")
    curves, summary = _curves(cfg), _summary(cfg)
    figs = {"learning curves": synthetic.plot_learning_curves(curves, cfg),
            "entropy": synthetic.plot_entropy(curves),
            "sweep": synthetic.plot_sweep(summary),
            "sweep curves": synthetic.plot_sweep_curves(curves, cfg)}
    yield figs
    for f in figs.values():
        plt.close(f)


@pytest.mark.parametrize("name", ["learning curves", "entropy", "sweep", "sweep curves"])
def test_figure_fits_the_column_unscaled(figures, name):
    assert _png_width(figures[name]) <= COLUMN_PX, name


@pytest.mark.parametrize("name", ["learning curves", "entropy"])
def test_no_legend_covers_a_panel(figures, name):
    fig = figures[name]
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    assert legends, name  # the settings are still named
    for leg in legends:
        box = leg.get_window_extent(r)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(r)), (name, ax.get_title())
