"""The first page's forest plot: the paper's CTRLS - Base differences with Newcombe intervals and MDD bands."""
from __future__ import annotations

import numpy as np
import pandas as pd

FOREST_WIDTH_IN = 5.2  # shown at its own size at 1280 px, and at 0.69 of it on a 390 px phone


FOREST_FONT_PT = 10  # every text of the plot: about 9.5 px high on a phone, 14 px on a desktop


_SHORT = {"Llama-3.2-3B-Instruct": "Llama-3.2", "Qwen2.5-3B-Instruct": "Qwen2.5"}


_DATASETS = {"gsm8k": "GSM8K", "math": "MATH"}


def _group_label(backbone: str, dataset: str, metric: str) -> str:
    bb = str(backbone).split("/")[-1]
    return f"{_SHORT.get(bb, bb.replace('-Instruct', ''))} · {_DATASETS.get(dataset, dataset)} · {metric}"


def paper_forest(pw: pd.DataFrame):
    """A forest plot of the paper's CTRLS − Base differences (``ctrls.report.paper_power.paper_power``), one
    panel per table, stacked, so that it reads on a phone. The differences are grouped, one row per
    backbone × dataset × metric (16 row labels in all, not one per difference); within a row each of the
    group's differences (temperature × configuration) is a dot with its 95% Newcombe interval, over a grey
    bar from −MDD to +MDD, the smallest change from Base its test detects with power 0.8 at the paper's
    inferred n (to the edge where no rate is detectable). Every difference is in the summary page's table.
    Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt  # headless outside a kernel: matplotlib falls back to Agg

    tables = list(dict.fromkeys(pw["table"]))
    keys = ["backbone", "dataset", "metric"]
    groups = {t: list(dict.fromkeys(map(tuple, pw.loc[pw["table"] == t, keys].to_numpy()))) for t in tables}
    fig, axes = plt.subplots(len(tables), 1, figsize=(FOREST_WIDTH_IN, 1.5 + 0.42 * sum(map(len, groups.values()))),
                             squeeze=False, gridspec_kw={"height_ratios": [len(groups[t]) + 1.2 for t in tables]})
    f = FOREST_FONT_PT
    for ax, table in zip(axes[:, 0], tables):
        g = pw[pw["table"] == table]
        rows = groups[table]
        for i, key in enumerate(rows):
            d = g[(g[keys] == pd.Series(key, index=keys)).all(axis=1)]
            m = len(d)
            y = (len(rows) - 1 - i) + np.linspace(0.3, -0.3, m) if m > 1 else np.array([len(rows) - 1 - i], float)
            up = d["MDD up (pp)"].fillna(100 - d["base (%)"]).to_numpy()  # no detectable gain: up to 100%
            down = d["MDD down (pp)"].fillna(d["base (%)"]).to_numpy()
            ax.barh(y, up + down, left=-down, height=0.6 / max(m, 1), color="0.85", lw=0,
                    label="not detectable (±MDD)" if i == 0 else None)
            diff = d["diff (pp)"].to_numpy()
            below = d["below MDD"].astype(bool).to_numpy()
            for ok, colour, name in ((True, "tab:blue", "CTRLS − Base, 95% CI (smaller than its MDD)"),
                                     (False, "tab:red", "CTRLS − Base, 95% CI (larger than its MDD)")):
                sel = below == ok
                if sel.any():
                    ax.errorbar(diff[sel], y[sel], xerr=[diff[sel] - d["lo (pp)"].to_numpy()[sel],
                                                         d["hi (pp)"].to_numpy()[sel] - diff[sel]],
                                fmt="o", ms=3.5, color=colour, elinewidth=0.9, capsize=0,
                                label=name if i == 0 else None)
        ax.axvline(0, color="0.3", lw=0.8)
        ax.set_yticks(range(len(rows)), [_group_label(*k) for k in reversed(rows)], fontsize=f)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.tick_params(axis="x", labelsize=f)
        ax.set_xlabel("CTRLS − Base (points)", fontsize=f)
        n = int(g["n"].iloc[0])
        ax.set_title(f"{table} · n = {n} (inferred) · {len(g)} differences", fontsize=f + 1)
        ax.grid(axis="y", visible=False)
    handles, labels = [], []
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h), labels.append(lab)
    fig.legend(handles, labels, fontsize=f, loc="lower center", ncol=1, frameon=False)
    fig.tight_layout(rect=(0, (0.1 + 0.22 * len(labels)) / fig.get_figheight(), 1, 1))
    return fig
