"""The book's figures (seaborn/matplotlib). Each function returns the matplotlib Figure."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch

sns.set_theme(context="notebook", style="whitegrid")


def bound_curve(history: pd.DataFrame, kl_history: pd.DataFrame | None = None) -> plt.Figure:
    """Thm. 5.3's bound (solid, with its 95% interval over questions) and the relaxed training
    objective (dashed) over adapter-training epochs, per split (``PretrainRun.bound_history``;
    epoch 0 = the fresh adapter = the frozen backbone), and the transition fit of stage (e)."""
    n = 4 if kl_history is not None else 3
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6))
    panels = [("elbo_per_step", "relaxed_per_step", "per step: ELBO and relaxed objective", "nats / step"),
              ("rec_per_token", "relaxed_rec_per_token", "reconstruction / token", "nats / token"),
              ("kl_per_step", "mixture_kl_per_step", "KL term / step", "nats / step")]
    for ax, (solid, dashed, title, ylabel) in zip(axes, panels):
        for i, (split, g) in enumerate(history.sort_values("epoch").groupby("split", sort=False)):
            ax.plot(g.epoch, g[solid], marker="o", color=f"C{i}", label=f"{split}: Thm. 5.3")
            ax.plot(g.epoch, g[dashed], ls="--", marker=".", color=f"C{i}", label=f"{split}: relaxed")
            if solid == "elbo_per_step":
                ax.fill_between(g.epoch, g.elbo_per_step_lo, g.elbo_per_step_hi, color=f"C{i}", alpha=0.15, lw=0)
        ax.set(title=title, xlabel="epoch", ylabel=ylabel)
    axes[0].legend(fontsize=8)
    if kl_history is not None:
        mixture = "objective" in kl_history and (kl_history.objective == "mixture").all()
        sns.lineplot(data=kl_history, x="step", y="kl", color="C2", marker="o", ax=axes[3])
        axes[3].set(title="transition fit (stage e)", xlabel="gradient step" if mixture else "closed form (one value)",
                    ylabel="mean mixture-prior KL" if mixture else "mean expected KL (Thm. 5.3)")
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
    # Fig.: the on-policy learning curves (appendix figures "On-policy learning curves")
    d = curves[curves.kind == kind].copy()
    if smooth > 1:
        d[y] = d.groupby(["pair", "setting", "seed"])[y].transform(lambda v: v.rolling(smooth, min_periods=1).mean())
    g = sns.relplot(data=d, x="step", y=y, hue="setting", col="pair", kind="line", errorbar=("pi", 100),
                    height=3.4, aspect=1.25, facet_kws={"sharey": False}, marker="o" if kind == "eval" else None)
    g.set_axis_labels("RL step", ylabel or y)
    g.set_titles("{col_name}")
    return g.figure
