"""ctrls.report.forest: the paper's forest plot has one panel per table, one row per backbone × dataset × metric
(the first at the top, labelled with short names), one dot per difference with its own interval, blue where
the difference is below its MDD and red where not, over a grey band from −MDD down to +MDD up (to 100% or
to 0 where no change is detectable); checked on a hand-made frame and on the paper's own differences."""
import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

import ctrls.report.forest as fd
from ctrls.report import paper_power


def test_forest_plot_has_one_point_per_paper_difference():
    pw = paper_power.paired_p_columns(paper_power.paper_power())
    fig = fd.paper_forest(pw)
    from matplotlib.container import ErrorbarContainer

    counts = [sum(len(c.lines[0].get_xdata()) for c in ax.containers if isinstance(c, ErrorbarContainer))
              for ax in fig.axes]
    assert counts == list(pw.groupby("table", sort=False).size())
    assert [ax.get_title() for ax in fig.axes] == [f"{t} · n = {n} (inferred) · {len(g)} differences"
                                                   for (t, n), g in pw.groupby(["table", "n"], sort=False)]


def diff(table, backbone, dataset, metric, d, lo, hi, up, down, base, below, n=40):
    return {"table": table, "backbone": backbone, "dataset": dataset, "metric": metric, "diff (pp)": d, "lo (pp)": lo,
            "hi (pp)": hi, "MDD up (pp)": up, "MDD down (pp)": down, "base (%)": base, "below MDD": below, "n": n}


LLAMA, QWEN = "meta-llama/Llama-3.2-3B-Instruct", "Qwen/Qwen2.5-3B-Instruct"
FRAME = pd.DataFrame([
    diff("Table 1", LLAMA, "gsm8k", "pass@20", 5.0, -10.0, 20.0, 25.0, 30.0, 70.0, True),
    diff("Table 1", LLAMA, "gsm8k", "pass@20", 40.0, 25.0, 55.0, 25.0, 30.0, 50.0, False),
    diff("Table 1", QWEN, "math", "Succ.", -2.5, -20.0, 15.0, math.nan, 40.0, 97.5, True),  # nothing detectable up
    diff("Table 2", "org/Other-7B-Instruct", "aime", "pass@20", 1.0, -3.0, 5.0, 6.0, math.nan, 1.0, True, n=500),
])


def test_group_labels_are_short():
    assert fd._group_label(LLAMA, "gsm8k", "pass@20") == "Llama-3.2 · GSM8K · pass@20"
    assert fd._group_label(QWEN, "math", "Succ.") == "Qwen2.5 · MATH · Succ."
    assert fd._group_label("org/Other-7B-Instruct", "aime", "pass@20") == "Other-7B · aime · pass@20"


def test_each_difference_is_a_dot_with_its_interval_over_its_mdd_band():
    fig = fd.paper_forest(FRAME)
    one, two = fig.axes[:2]
    assert len(fig.axes) == 2
    assert [t.get_text() for t in one.get_yticklabels()] == ["Qwen2.5 · MATH · Succ.", "Llama-3.2 · GSM8K · pass@20"]
    assert one.get_title() == "Table 1 · n = 40 (inferred) · 3 differences"
    assert two.get_title() == "Table 2 · n = 500 (inferred) · 1 differences"
    dots = {}
    for c in one.containers:
        if isinstance(c, ErrorbarContainer):
            line, _, (bars,) = c.lines
            for x, y, seg in zip(line.get_xdata(), line.get_ydata(), bars.get_segments()):
                dots[float(x)] = (line.get_color(), float(y), seg[:, 0].tolist())
    assert dots[5.0][0] == dots[-2.5][0] == "tab:blue" and dots[40.0][0] == "tab:red"
    assert dots[5.0][2] == [-10.0, 20.0] and dots[40.0][2] == [25.0, 55.0] and dots[-2.5][2] == [-20.0, 15.0]
    assert dots[-2.5][1] == 0 and dots[5.0][1] > 0.5 and dots[40.0][1] > 0.5  # the first group is the top row
    bands = sorted((p.get_x(), p.get_x() + p.get_width()) for p in one.patches)
    assert bands == [(-40.0, 2.5), (-30.0, 25.0), (-30.0, 25.0)]  # no MDD up: the band runs to 100%
    (band,) = [(p.get_x(), p.get_x() + p.get_width()) for p in two.patches]
    assert band == pytest.approx((-1.0, 6.0))  # no MDD down: to 0%
    labels = fig.legends[0].get_texts()
    assert [t.get_text() for t in labels] == ["not detectable (±MDD)", "CTRLS − Base, 95% CI (smaller than its MDD)",
                                              "CTRLS − Base, 95% CI (larger than its MDD)"]


def test_the_figure_grows_with_the_rows_and_keeps_its_width():
    small = fd.paper_forest(FRAME[FRAME.table == "Table 2"])
    big = fd.paper_forest(FRAME)
    assert small.get_figwidth() == big.get_figwidth() == fd.FOREST_WIDTH_IN
    assert big.get_figheight() > small.get_figheight()
    assert np.isclose(big.get_figheight(), 1.5 + 0.42 * 3)  # three rows: two in Table 1, one in Table 2
