"""The book's figures (seaborn/matplotlib). Each function returns the matplotlib Figure."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch

sns.set_theme(context="notebook", style="whitegrid")


def elbo_curve(history: pd.DataFrame, kl_history: pd.DataFrame | None = None) -> plt.Figure:
    """ELBO terms over adapter-training epochs (epoch 0 = fresh adapter = the frozen backbone)."""
    n = 3 if kl_history is not None else 2
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.4))
    sns.lineplot(data=history, x="epoch", y="rec_per_token", marker="o", ax=axes[0])
    axes[0].set(title="reconstruction: log-likelihood / token", ylabel="nats")
    sns.lineplot(data=history, x="epoch", y="kl_per_step", marker="o", color="C1", ax=axes[1])
    axes[1].set(title="KL(s_t ‖ s_{t-1} softmax(L)) / step", ylabel="nats")
    if kl_history is not None:
        sns.lineplot(data=kl_history, x="step", y="kl", color="C2", ax=axes[2])
        axes[2].set(title="transition fit (stage e)", xlabel="gradient step", ylabel="mean KL")
    fig.tight_layout()
    return fig


def transitions_and_sizes(L: torch.Tensor, states: pd.Series) -> plt.Figure:
    """The K x K transition matrix softmax(L) and the number of training steps per state."""
    P = torch.softmax(L.float(), -1).numpy()
    K = P.shape[0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [1.2, 1]})
    sns.heatmap(P, ax=axes[0], cmap="viridis", vmin=0, square=True, cbar_kws={"label": "P(s_t = j | s_{t-1} = i)"},
                xticklabels=max(1, K // 16), yticklabels=max(1, K // 16))
    axes[0].set(title=f"transition matrix softmax(L), K = {K}", xlabel="next state j", ylabel="state i")
    counts = states.value_counts().reindex(range(K), fill_value=0)
    sns.barplot(x=np.arange(K), y=counts.to_numpy(), ax=axes[1], color="C0")
    axes[1].set(title="cluster sizes (training steps per state)", xlabel="state", ylabel="steps")
    axes[1].set_xticks(axes[1].get_xticks()[:: max(1, K // 16)])
    fig.tight_layout()
    return fig


def pass_at_k_curves(curves: pd.DataFrame) -> plt.Figure:
    """Unbiased pass@k vs k, Base vs each CTRLS row, one panel per (backbone, dataset, eta)."""
    curves = curves.assign(panel=curves.backbone.str.split("/").str[-1] + " · " + curves.dataset + " · η=" +
                           curves.temperature.astype(str), pass_at_k=100 * curves.pass_at_k)
    g = sns.relplot(data=curves, x="k", y="pass_at_k", hue="config", col="panel", kind="line", marker="o",
                    height=3.3, aspect=1.1, facet_kws={"sharey": False})
    g.set_axis_labels("k", "pass@k (%)")
    g.set_titles("{col_name}")
    return g.figure


def learning_curves(curves: pd.DataFrame, y: str = "accuracy", kind: str = "eval", ylabel: str | None = None,
                    smooth: int = 1) -> plt.Figure:
    """A metric against RL step, mean and band over seeds, one panel per (backbone, dataset)."""
    d = curves[curves.kind == kind].copy()
    if smooth > 1:
        d[y] = d.groupby(["pair", "setting", "seed"])[y].transform(lambda v: v.rolling(smooth, min_periods=1).mean())
    g = sns.relplot(data=d, x="step", y=y, hue="setting", col="pair", kind="line", errorbar=("pi", 100),
                    height=3.4, aspect=1.25, facet_kws={"sharey": False}, marker="o" if kind == "eval" else None)
    g.set_axis_labels("RL step", ylabel or y)
    g.set_titles("{col_name}")
    return g.figure
