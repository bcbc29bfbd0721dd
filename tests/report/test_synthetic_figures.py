"""The synthetic page's figures fit the book's 948 px column at their own size
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

from ctrls.config.schema import load_config  # noqa: E402
from ctrls.report import synthetic_figures  # noqa: E402
from ctrls.synthetic import chain as synthetic  # noqa: E402

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
    figs = {"learning curves": synthetic_figures.plot_learning_curves(curves, cfg),
            "entropy": synthetic_figures.plot_entropy(curves),
            "sweep": synthetic_figures.plot_sweep(summary),
            "sweep curves": synthetic_figures.plot_sweep_curves(curves, cfg)}
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


# ---- the RL page (03) -------------------------------------------------------------------------


def _rl_curves() -> pd.DataFrame:
    rows = []
    for setting, seed, step, kind in itertools.product(["none", "epsilon"], [0, 1], [0, 5, 10], ["eval", "train"]):
        rows.append(dict(pair="SmolLM2-135M__word_problems", setting=setting, seed=seed, step=step, kind=kind,
                         accuracy=0.1 * step / 10 + seed / 100, reward=step / 20, succ=0.9, **{"pass@k": 0.5},
                         policy_entropy=2.0 - step / 10, state_usage_entropy=1.5, epsilon=0.0, alpha=0.0))
    return pd.DataFrame(rows)


def test_rl_summary_table_has_readable_headers_and_a_caption():
    from ctrls.report import tables

    t = tables.rl_summary(_rl_curves())
    assert not [c for c in t.columns if "_" in str(c)], list(t.columns)
    assert set(t["backbone, dataset"]) == {"SmolLM2-135M, word problems"}
    assert "step 10" in t.attrs["note"] and "2 seeds" in t.attrs["note"]
    assert t.loc[t.setting == "none", "accuracy at step 0"].item() == pytest.approx(0.005)


def test_rl_panel_titles_name_the_backbone_and_dataset():
    import matplotlib.pyplot as plt

    from ctrls.report import plots

    assert plots.pair_title("SmolLM2-135M__word_problems") == "SmolLM2-135M, word problems"
    fig = plots.learning_curves(_rl_curves(), y="accuracy")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    plt.close(fig)
    assert titles == ["SmolLM2-135M, word problems"], titles


# ---- the exploration page (02) ----------------------------------------------------------------


def test_a_filtered_frame_shows_no_stray_index_column():
    from ctrls.report.display import frame_html

    df = pd.DataFrame({"config": ["a", "b", "c", "d", "e"], "x": [1.5, 2.5, 3.5, 4.5, 5.5]})
    df = df[df.config.isin(["b", "d", "e"])]  # what vs_base_view's filter left: rows 1, 3, 4
    assert list(df.index) == [1, 3, 4] and not isinstance(df.index, pd.RangeIndex)
    html = frame_html(df)
    assert 'class="row_heading' not in html and "blank" not in html, html
    named = df.rename_axis("row")
    assert 'class="row_heading' in frame_html(named)  # a named index is the reader's: kept


def test_one_rounding_per_column():
    from ctrls.report import tables

    cells = tables._fmt_column([0.0, 0.167], [-0.675, 0.12], [0.675, 0.21], sign=True)
    decimals = {c.split(" ")[0].split(".")[-1].__len__() if "." in c.split(" ")[0] else 0 for c in cells}
    assert len(decimals) == 1 and decimals == {1}, cells  # "+0.0 [...]" beside "+16.7 [...]", not "+0 [-68, +68]"
    from ctrls.report.provenance import with_pct_ci

    t = pd.DataFrame({"pass@n": [0.0, 0.5], "pass@n lo": [0.0, 0.49], "pass@n hi": [0.56, 0.51],
                      "succ": [0.1, 0.2], "succ lo": [0.0, 0.1], "succ hi": [0.7, 0.3]})
    col = with_pct_ci(t)["pass@n (%)"]
    assert col.tolist() == ["0.0 [0.0, 56.0]", "50.0 [49.0, 51.0]"], col.tolist()


def _exploration_frames():
    table = pd.DataFrame([
        dict(dataset="gsm8k", temperature=0.7, config="Base", questions=3, samples=2, **{"pass@n": 0.0, "pass@n lo": 0.0,
             "pass@n hi": 0.5, "succ": 0.2, "succ lo": 0.0, "succ hi": 0.7, "p": np.nan, "p (Holm)": np.nan,
             "Δ pass@n vs Base": np.nan, "Δ lo": np.nan, "Δ hi": np.nan})] + [
        dict(dataset="gsm8k", temperature=0.7, config=f"eps={e}", questions=3, samples=2, **{"pass@n": e, "pass@n lo": 0.0,
             "pass@n hi": 0.9, "succ": 0.2, "succ lo": 0.0, "succ hi": 0.7, "p": p, "p (Holm)": p,
             "Δ pass@n vs Base": e, "Δ lo": -0.5, "Δ hi": 0.9}) for e, p in ((0.1, 0.9), (0.3, 0.04), (0.5, 0.5))])
    ablation = pd.DataFrame([dict(dataset="gsm8k", temperature=0.7, comparison="fixed s0 − Base", **{
        f"Δ {m}": 0.1, f"Δ {m} lo": -0.5, f"Δ {m} hi": 0.6, f"p ({m}, Holm)": 1.0}) for m in ("x",)])
    for m in ("pass@n", "Succ."):
        ablation = ablation.assign(**{f"Δ {m}": 0.1, f"Δ {m} lo": -0.5, f"Δ {m} hi": 0.6, f"p ({m}, Holm)": 1.0})
    control = pd.DataFrame([dict(dataset="gsm8k", temperature=0.7, config=c, steps=10, follows=0.2, chance=0.25,
                                 **{"Base, random states": 0.17, "Δ vs Base": 0.03, "Δ lo": -0.4, "Δ hi": 0.5,
                                    "p (Holm)": 1.0}) for c in ("eps=0.1", "eps=0.3")])
    return table, ablation, control


def test_the_box_shows_three_sentences_that_matter_and_folds_the_rest():
    from ctrls.report import verdicts

    table, ablation, control = _exploration_frames()
    every = verdicts.exploration_sentences(table, ablation, control)
    key, others = verdicts.exploration_highlights(table, ablation, control)
    assert len(every) == 1 + 3 + 2 + 2 and len(key) == 3 and sorted(key + others) == sorted(every)
    assert "eps=0.3 vs Base" in key[0]  # the smallest Holm-adjusted p of Table 1's rows
    assert "ablation, fixed s0 − Base, pass@n" in key[1]
    assert "controllability, eps=0.1" in key[2]


# ---- the setup check (00) ----------------------------------------------------------------------


def test_setup_tables_show_no_raw_tex_and_say_which_data_the_profile_skips(monkeypatch):
    from types import SimpleNamespace

    from ctrls.report import setup_check

    assert setup_check.plain_tex("What is $12$ times $k$?") == "What is 12 times k?"
    assert setup_check.plain_tex(r"Mike paid $\$1.25$; find $\frac{1}{2}$ of $x^2$.") == "Mike paid $1.25; find 1/2 of x².", \
        setup_check.plain_tex(r"Mike paid $\$1.25$; find $\frac{1}{2}$ of $x^2$.")
    assert setup_check.plain_tex("Carmen has $100, Samantha $25 more.") != ""  # GSM8K's dollars: left readable

    problem = SimpleNamespace(id="math-test-1", question="Find $k$ if $12k = 24$.", answer="$2$", steps=["a", "b"])
    monkeypatch.setattr(setup_check, "load_problems", lambda *a, **k: [problem])
    cfg = load_config("demo")
    cfg.grid.datasets = ["gsm8k"]
    t = setup_check.dataset_table(cfg)
    used = dict(zip(t.dataset + "/" + t.split, t["used by this profile"]))
    assert used["math/test"] == "not used" and used["gsm8k/test"] == cfg.data.n_test, used
    demo = load_config("demo")  # the demo's GSM8K transfer questions are used, and said so
    t = setup_check.dataset_table(demo)
    used = dict(zip(t.dataset + "/" + t.split, t["used by this profile"]))
    assert used["gsm8k/test"] == f"{demo.grid.transfer_questions} (transfer)" and used["gsm8k/train"] == "not used", used
    ex = setup_check.example_problems(cfg, n=1)
    assert not ex.question.str.contains("$", regex=False).any() and set(ex.gold) == {"2"}, ex.to_dict("records")
