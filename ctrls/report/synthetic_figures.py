"""The synthetic study's figures (the study itself: ``ctrls.synthetic``)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ctrls.config.schema import Config
from ctrls.report.plots import MAX_WIDTH_IN, MIN_FONT_PT  # the book's column width and smallest text
from ctrls.synthetic.chain import SETTINGS, optimum, state_names, study_mdp, sweep_table


def _legend_below(fig, ax, title: str = "setting") -> None:
    """Move ``ax``'s legend under the figure's panels, in one row: it covers no curve."""
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, title=title, loc="lower center", ncol=len(labels), fontsize=MIN_FONT_PT,
               title_fontsize=MIN_FONT_PT, frameon=False, bbox_to_anchor=(0.5, 0.0))


def plot_learning_curves(curves: pd.DataFrame, cfg: Config, smooth: int = 10, source: str = ""):
    """The four settings: held-out reward (eps = 0) against the optimum 1, and the training reward
    (moving average) against each setting's V*_eps; mean and min-max band over seeds."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    d = curves[curves.setting.isin(SETTINGS)]
    ev, tr = d[d.kind == "eval"], d[d.kind == "train"].copy()
    tr["reward"] = tr.groupby(["setting", "seed"]).reward.transform(lambda v: v.rolling(smooth, min_periods=1).mean())
    fig, axes = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 4.0))
    order = [s for s in SETTINGS if s in set(d.setting)]
    pal = dict(zip(order, sns.color_palette(n_colors=len(order))))
    sns.lineplot(data=ev, x="step", y="eval_reward", hue="setting", hue_order=order, palette=pal,
                 errorbar=("pi", 100), marker="o", ax=axes[0])
    axes[0].axhline(optimum(study_mdp(cfg)[0], 0.0), ls="--", c="k", lw=1, label="optimum")
    axes[0].set(title="held-out reward of the Dirichlet policy (ε = 0)", xlabel="RL step", ylabel="mean reward")
    sns.lineplot(data=tr, x="step", y="reward", hue="setting", hue_order=order, palette=pal,
                 errorbar=("pi", 100), ax=axes[1], legend=False)
    mdp = study_mdp(cfg)[0]
    for name in order:
        axes[1].axhline(optimum(mdp, float(d[d.setting == name].epsilon.iloc[0])), ls="--", lw=1, c=pal[name])
    axes[1].set(title=f"training reward (ε-greedy; {smooth}-step mean)\ndashed: " + r"$V^*_\varepsilon$",
                xlabel="RL step", ylabel="mean reward")
    from ctrls.report.plots import integer_ticks, show, with_source

    integer_ticks(*axes)
    for ax in axes:
        ax.title.set_fontsize(10)
    _legend_below(fig, axes[0])
    return show(fig, with_source("The paper's four RL settings on the synthetic chain, mean and min–max band over "
                           f"{d.seed.nunique()} seeds. Left: held-out reward of the learned Dirichlet policy (ε = 0) "
                           "against the optimum 1 (dashed). Right: on-policy training reward "
                           f"(ε-greedy, {smooth}-step moving average) against each setting's optimum "
                           "*V*\\*<sub>ε</sub> (dashed, same colour).", source))


def plot_entropy(curves: pd.DataFrame, source: str = ""):
    """The four settings: the policy's categorical entropy (Eq. 14) over the visited states of each
    training step, and at the start state (exact) at each evaluation."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    d = curves[curves.setting.isin(SETTINGS)]
    order = [s for s in SETTINGS if s in set(d.setting)]
    fig, axes = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 4.0))
    sns.lineplot(data=d[d.kind == "train"], x="step", y="policy_entropy", hue="setting", hue_order=order,
                 errorbar=("pi", 100), ax=axes[0])
    axes[0].set(title="policy entropy over visited states (training)", xlabel="RL step", ylabel="nats")
    sns.lineplot(data=d[d.kind == "eval"], x="step", y="start_entropy", hue="setting", hue_order=order,
                 errorbar=("pi", 100), marker="o", ax=axes[1], legend=False)
    axes[1].set(title="entropy of the first transition from $s_0$", xlabel="RL step", ylabel="nats")
    from ctrls.report.plots import integer_ticks, show, with_source

    integer_ticks(*axes)
    for ax in axes:
        ax.title.set_fontsize(10)
    _legend_below(fig, axes[0])  # inside a panel it covered the curves
    return show(fig, with_source("Policy entropy (Eq. 14) per setting, mean and min–max band over seeds. Left: over the states "
                                 "visited in each training step; right: exactly, at the start state *s*<sub>0</sub>, "
                                 "at each evaluation.", source))


def plot_sweep(summary: pd.DataFrame, source: str = ""):
    """Heatmaps over the eps x alpha grid: final held-out reward, the fraction of seeds that end on
    the correct chain, and the start-state entropy after RL."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axes = plt.subplots(1, 3, figsize=(MAX_WIDTH_IN, 3.3))  # 14 in was shown downscaled to 948 px
    kw = dict(annot=True, fmt=".2f", annot_kws={"fontsize": MIN_FONT_PT})
    sns.heatmap(sweep_table(summary), vmin=0, vmax=1, cmap="viridis", ax=axes[0], **kw)
    axes[0].set(title="final held-out reward\n(mean over seeds)")
    sns.heatmap(sweep_table(summary.assign(found=summary.found.astype(float)), "found"),
                vmin=0, vmax=1, cmap="viridis", ax=axes[1], **kw)
    axes[1].set(title="fraction of seeds\non the correct chain")
    sns.heatmap(sweep_table(summary, "start_entropy_final"), vmin=0, cmap="magma", ax=axes[2], **kw)
    axes[2].set(title="start-state entropy\nafter RL (nats)")
    for ax in axes:
        ax.title.set_fontsize(10)
    from ctrls.report.plots import show, with_source

    fig.tight_layout()
    return show(fig, with_source("The sweep over the ε × α grid (rows ε, columns α), "
                           "means over seeds: final held-out reward (left), fraction of seeds that end on the correct chain "
                           "(middle), start-state entropy after RL (right).", source))


def plot_sweep_curves(curves: pd.DataFrame, cfg: Config, source: str = ""):
    """Held-out reward against RL step for every cell of the sweep grid: one panel per alpha, one
    line per epsilon (mean and min-max band over seeds)."""
    import seaborn as sns

    grid = curves.epsilon.isin(cfg.synthetic.epsilons) & curves.alpha.isin(cfg.synthetic.alphas)
    ev = curves[grid & (curves.kind == "eval")].rename(columns={"epsilon": "ε", "alpha": "α"})
    g = sns.relplot(data=ev, x="step", y="eval_reward", hue="ε", col="α", kind="line", errorbar=("pi", 100),
                    palette="viridis", height=2.7, aspect=1.0)
    for ax in g.axes.flat:
        ax.axhline(optimum(study_mdp(cfg)[0], 0.0), ls="--", c="k", lw=1)
    g.set_axis_labels("RL step", "held-out reward (ε = 0)")
    g.set_titles("α = {col_name}", size=10)
    from ctrls.report.plots import integer_ticks, show, with_source

    integer_ticks(*g.axes.flat)
    return show(g.figure, with_source("Held-out reward (ε = 0) against the RL step for every cell of the sweep: one "
                                "panel per entropy weight α, one line per ε (mean and min–max band over "
                                "seeds); dashed: the optimum 1.", source))


def plot_prior(cfg: Config, source: str = ""):
    """The prior P = softmax(L_0) with the rewarding edges marked."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    mdp, P = study_mdp(cfg)
    names = state_names(mdp)
    fig, ax = plt.subplots(figsize=(5.6, 4.4))
    annot = np.where(mdp.edges, "•", "")
    sns.heatmap(P.numpy(), annot=annot, fmt="", cmap="viridis", vmin=0, vmax=1, square=True, ax=ax,
                xticklabels=names, yticklabels=names, cbar_kws={"label": r"$P(z_t = j \mid z_{t-1} = i)$"})
    ax.set(title=r"prior $\mathrm{softmax}(L_0)$ (• rewarding edge)", xlabel="next state $j$", ylabel="state $i$")
    from ctrls.report.plots import show, with_source

    fig.tight_layout()
    return show(fig, with_source(f"The synthetic MDP's prior transition matrix softmax(*L*<sub>0</sub>) over its {len(names)} "
                           "states, the starting point of RL; • marks a rewarding edge.", source))


def plot_recovery(recovery: pd.DataFrame, source: str = ""):
    """Mean and max row TV error of softmax(L) fitted on n chains, against n (log-log), with an
    n^(-1/2) reference through the mean error at the smallest n."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    long = recovery.melt(id_vars=["chains", "seed"], value_vars=["mean_tv", "max_tv"], var_name="error", value_name="TV")
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    sns.lineplot(data=long, x="chains", y="TV", hue="error", marker="o", errorbar=("pi", 100), ax=ax)
    n = np.array(sorted(recovery.chains.unique()), dtype=float)
    ref = recovery[recovery.chains == n[0]].mean_tv.mean() * np.sqrt(n[0] / n)
    ax.plot(n, ref, ls="--", c="k", lw=1, label=r"$\propto n^{-1/2}$")
    ax.set(xscale="log", yscale="log", xlabel="chains sampled from $P$",
           ylabel=r"TV$(\mathrm{softmax}(L), P)$ per row", title="recovering the transition matrix")
    ax.legend(fontsize=MIN_FONT_PT)
    from ctrls.report.plots import show, with_source

    fig.tight_layout()
    return show(fig, with_source("Recovering the transition matrix: mean and largest per-row total-variation error of "
                           "softmax(*L*) fitted on *n* sampled chains, against *n* (log–log; band: min–max over "
                           "seeds), with an *n*<sup>−1/2</sup> reference line (dashed).", source))
