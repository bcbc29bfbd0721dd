"""The book's figures (seaborn/matplotlib). Each function returns the matplotlib Figure.

In a notebook, each figure is shown by :func:`show` with a numbered caption that says what it
shows ("Figure 2: ..."), numbered in page order, and ends with where it was drawn from: the library
call and the run files it read (:func:`drawn_from`, passed to each figure function as ``source``);
a figure whose every plotted value is equal is replaced by one sentence that says so
(:func:`all_equal_note`), computed from the data.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from matplotlib.ticker import MaxNLocator

sns.set_theme(context="notebook", style="whitegrid")

_FIGURES = [0]  # figures shown on this page (one kernel per page)
# The book's content column is 948 px wide at 1280 px; at 100 dpi a figure at most this many inches
# wide is shown at its own size, never downscaled (ctrls.synthetic.chain uses the same width).
MAX_WIDTH_IN = 9.3


def _kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def caption(text: str) -> str:
    """The next figure's caption: "**Figure N.** text" (N counts this page's figures)."""
    _FIGURES[0] += 1
    return f"**Figure {_FIGURES[0]}.** {text}"


def show(fig, text: str):
    """In a notebook: display ``fig`` and, under it, its numbered caption, then close it (so it is
    not drawn twice). Outside a notebook: nothing is shown. Returns ``fig``."""
    if fig is not None and _kernel():
        from IPython.display import Markdown, display

        display(fig)
        display(Markdown(caption(text)))
        plt.close(fig)
    return fig


def with_source(text: str, source: str) -> str:
    """A caption ``text`` followed by its provenance sentence ``source`` (from :func:`drawn_from`)."""
    return f"{text} {source}" if source else text


ROOT = Path(__file__).resolve().parents[2]  # the repository: stored results are named from here


def _shown_path(path, run_dir) -> str:
    """``path`` as a reader sees it: under the run directory, relative to it (``<profile>/<stage>/...``);
    else in the repository, relative to its root (``bench/results/x.json``); a directory ends in "/"."""
    p = Path(path).expanduser().resolve()
    for base in ([Path(run_dir).expanduser().resolve()] if run_dir is not None else []) + [ROOT]:
        if p == base or base in p.parents:
            shown = p.relative_to(base).as_posix()
            return shown + "/" if p.is_dir() else shown
    where = f"the run directory {run_dir} nor " if run_dir is not None else ""
    raise ValueError(f"drawn_from: {path} is in neither {where}the repository {ROOT}; a caption names only a run "
                     "file (pass run_dir=cfg.run_dir) or a file of this checkout")


def drawn_from(call, *paths, run_dir=None) -> str:
    """The provenance sentence that ends a figure's caption: the library call that drew it and the
    files it read, e.g. "Drawn by `ctrls.report.plots.pass_at_k_curves` from `demo/exploration/samples.parquet/`."

    ``call``: the figure function (or its dotted name). ``paths``: the files read, as the stage
    modules compute them (a glob pattern names a family of files); each is shown relative to
    ``run_dir`` (``cfg.run_dir``: so ``<profile>/<stage>/<file>``) or, for a file of this checkout
    such as a stored ``bench/results`` result, relative to the repository. A path in neither is
    refused (``ValueError``), never shown as an absolute path. No path: drawn from the
    configuration alone."""
    name = call if isinstance(call, str) else f"{call.__module__}.{call.__qualname__}"
    shown = [f"`{_shown_path(p, run_dir)}`" for p in paths]
    if not shown:
        return f"Drawn by `{name}` from the configuration alone (no run file)."
    files = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
    return f"Drawn by `{name}` from {files}."


# The files a pretraining run's readers (``ctrls.stages.pretrain.PretrainRun``) load, by method:
# tests/report/test_plots.py checks each against the path the method itself reads.
PRETRAIN_FILES = {"bound_history": ("adapter", "bound_history.parquet"),
                  "transition_history": ("transitions", "kl_history.parquet"),
                  "controls_summary": ("adapter", "controls.parquet"),
                  "steps": ("states", "steps.parquet")}


def pretrain_file(run, method: str) -> Path:
    """The file ``PretrainRun.<method>()`` reads (``model``: the run's checkpoint directory)."""
    if method == "model":
        return Path(run.checkpoint)
    return Path(run.root).joinpath(*PRETRAIN_FILES[method])


def rl_curve_files(cfg) -> Path:
    """The RL curves ``ctrls.stages.rl.load_curves`` reads, as one glob pattern
    (``<run_dir>/<profile>/rl/<pair>/<run>/curve.parquet``)."""
    return cfg.stage_dir("rl") / "*" / "*" / "curve.parquet"


def say(text: str) -> None:
    """In a notebook: a sentence in place of a figure."""
    if _kernel():
        from IPython.display import Markdown, display

        display(Markdown(text))


def all_equal_note(values: pd.Series, what: str, unit: str = "", scale: float = 1.0) -> str | None:
    """One sentence when every value of ``values`` is equal (a figure of it would be a flat line),
    else None."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return f"No figure of {what}: there is no value to plot."
    if v.nunique() > 1:
        return None
    return (f"No figure of {what}: every one of its {len(v)} values is {scale * v.iloc[0]:.3g}{unit}, "
            "so the curves would be one flat line.")


def integer_ticks(*axes) -> None:
    """Whole-number ticks on the x axis (steps, epochs, k)."""
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _flat(values) -> pd.Series:
    """``values`` as numbers rounded to 10 significant digits: a difference below that is no curve."""
    v = pd.to_numeric(pd.Series(values), errors="coerce").astype(float)
    return v.map(lambda x: float(f"{x:.10g}") if np.isfinite(x) else x)


def bound_curve(history: pd.DataFrame, kl_history: pd.DataFrame | None = None, source: str = "") -> plt.Figure:
    """Thm. 5.3's bound (solid, with its 95% interval over questions) and the relaxed training
    objective (dashed) over adapter-training epochs, per split (``PretrainRun.bound_history``;
    epoch 0 = the fresh adapter = the frozen backbone), and the transition fit of stage (e).

    Two figures, each shown with its caption (ending with ``source``): the bound per step and its
    reconstruction term; the KL term and the transition fit. When every line of the second is flat
    (each its own value at every epoch, and the fit one value), it is one computed sentence instead
    (:func:`all_equal_note`). Returns the second figure (None when it is a sentence)."""
    # a closed-form transition fit is one number: said in the caption, not drawn as a one-point panel
    fit_panel = kl_history is not None and pd.to_numeric(kl_history.kl, errors="coerce").nunique() > 1
    fig, axes = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 3.8))
    fig2, axes2 = plt.subplots(1, 2 if fit_panel else 1, figsize=(MAX_WIDTH_IN if fit_panel else 5.5, 3.8), squeeze=False)
    axes2 = axes2[0]
    panels = [("elbo_per_step", "relaxed_per_step", "ELBO and relaxed objective", "nats / step"),
              ("rec_per_token", "relaxed_rec_per_token", "reconstruction", "nats / token"),
              ("kl_per_step", "mixture_kl_per_step", "KL term", "nats / step")]
    for ax, (solid, dashed, title, ylabel) in zip([*axes, axes2[0]], panels):
        for i, (split, g) in enumerate(history.sort_values("epoch").groupby("split", sort=False)):
            ax.plot(g.epoch, g[solid], marker="o", color=f"C{i}", label=f"{split}: Thm. 5.3")
            ax.plot(g.epoch, g[dashed], ls="--", marker=".", color=f"C{i}", label=f"{split}: relaxed")
            if solid == "elbo_per_step":
                ax.fill_between(g.epoch, g.elbo_per_step_lo, g.elbo_per_step_hi, color=f"C{i}", alpha=0.15, lw=0)
        ax.set(title=title, xlabel="adapter-training epoch", ylabel=ylabel)
        integer_ticks(ax)
    axes[0].legend(fontsize=8)
    axes2[0].legend(fontsize=8)
    splits = " and ".join(history.split.drop_duplicates().astype(str))
    fig.tight_layout()
    show(fig, with_source(f"Thm. 5.3's bound (solid; band: 95% interval over questions) and the relaxed training objective "
                    f"(dashed) over adapter-training epochs, on the {splits} steps. Left: per step; right: its "
                    "reconstruction term per token. Epoch 0 is the fresh adapter, i.e. the frozen backbone.", source))
    kl_lines = [(split, label, _flat(g.sort_values("epoch")[col]))
                for split, g in history.groupby("split", sort=False)
                for col, label in (("kl_per_step", "KL term"), ("mixture_kl_per_step", "mixture-prior KL"))]
    flat = [all_equal_note(v, f"the {label} on the {split} steps") for split, label, v in kl_lines]
    if not fit_panel and all(flat):
        plt.close(fig2)
        epochs = history.epoch.nunique()
        values = "; ".join(f"{label} on the {split} steps {v.dropna().iloc[0]:.4g}" if not v.dropna().empty
                           else f"{label} on the {split} steps: no value"
                           for split, label, v in kl_lines)
        text = (f"No figure of the bound's KL term: every one of its {len(kl_lines)} lines is flat over the "
                f"{epochs} adapter-training epoch{'s' if epochs != 1 else ''} (nats per step: {values})")
        if kl_history is not None:
            mixture = "objective" in kl_history and (kl_history.objective == "mixture").all()
            text += (f"; the transition fit (stage e) reached a mean {'mixture-prior' if mixture else 'expected'} "
                     f"KL of {float(kl_history.kl.iloc[-1]):.3g} nats")
        say(text + ".")
        return None
    text = "The bound's KL term per step (solid) and the mixture-prior KL (dashed) over adapter-training epochs"
    if kl_history is not None and not fit_panel:
        mixture = "objective" in kl_history and (kl_history.objective == "mixture").all()
        kind = "mixture-prior" if mixture else "expected"
        text += (f". The transition fit (stage e) reached a mean {kind} KL of {float(kl_history.kl.iloc[-1]):.3g} nats "
                 "(one value, so no panel)")
    if fit_panel:
        mixture = "objective" in kl_history and (kl_history.objective == "mixture").all()
        sns.lineplot(data=kl_history, x="step", y="kl", color="C2", marker="o", ax=axes2[1])
        axes2[1].set(title="transition fit (stage e)", xlabel="gradient step" if mixture else "closed form (one value)",
                     ylabel="mean mixture-prior KL" if mixture else "mean expected KL")
        integer_ticks(axes2[1])
        text += ("; right: the transition fit's KL, " + ("by gradient step." if mixture else
                 "in closed form (one value: the row-normalised soft counts)."))
    fig2.tight_layout()
    return show(fig2, with_source(text + ".", source))


MAX_TICKS = 8  # state labels per axis: more of them overlap at the book's column width


def state_ticks(K: int) -> np.ndarray:
    """The states labelled on a K-state axis: 0 and every ``ceil(K / MAX_TICKS)``-th state after it."""
    return np.arange(0, K, max(1, math.ceil(K / MAX_TICKS)))


def transitions_and_sizes(L: torch.Tensor, states: pd.Series, source: str = "") -> plt.Figure:
    """The K x K transition matrix softmax(L) and the number of training steps per state. At most
    ``MAX_TICKS`` state labels per axis, upright, so that none overlaps another at any K."""
    P = torch.softmax(L.float(), -1).numpy()
    K = P.shape[0]
    fig, axes = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 4.2), gridspec_kw={"width_ratios": [1.2, 1]})
    sns.heatmap(P, ax=axes[0], cmap="viridis", vmin=0, square=True, cbar_kws={"label": r"$P(s_t = j \mid s_{t-1} = i)$"},
                xticklabels=False, yticklabels=False)
    ticks = state_ticks(K)
    axes[0].set_xticks(ticks + 0.5, [str(t) for t in ticks], rotation=0, fontsize=9)
    axes[0].set_yticks(ticks + 0.5, [str(t) for t in ticks], rotation=0, fontsize=9)
    axes[0].set(title=rf"transition matrix $\mathrm{{softmax}}(L)$, $K = {K}$", xlabel="next state $j$", ylabel="state $i$")
    counts = states.value_counts().reindex(range(K), fill_value=0)
    sns.barplot(x=np.arange(K), y=counts.to_numpy(), ax=axes[1], color="C0")
    axes[1].set(title="cluster sizes (training steps per state)", xlabel="state", ylabel="steps")
    axes[1].set_xticks(ticks, [str(t) for t in ticks], rotation=0, fontsize=9)
    for ax in axes:
        ax.title.set_fontsize(10)
    fig.tight_layout()
    return show(fig, with_source(f"Left: the fitted transition matrix softmax(*L*) over the K = {K} latent states "
                     f"(row i: the distribution of the next state after state i). Right: the number of training "
                     f"steps assigned to each state ({int(counts.sum())} in all; {int((counts == 0).sum())} states unused).", source))


def pass_at_k_curves(curves: pd.DataFrame, source: str = "") -> plt.Figure:
    """Unbiased pass@k vs k, Base vs each CTRLS row, one panel per (backbone, dataset, eta)."""
    note = all_equal_note(curves.pass_at_k, "pass@k", "%", 100)
    if note:
        return say(note + " (every row, every k).")
    curves = curves.assign(panel=curves.backbone.str.split("/").str[-1] + " · " + curves.dataset + " · η=" +
                           curves.temperature.astype(str), pass_at_k=100 * curves.pass_at_k)
    g = sns.relplot(data=curves, x="k", y="pass_at_k", hue="config", col="panel", kind="line", marker="o",
                    height=3.3, aspect=1.1, facet_kws={"sharey": False})
    g.set_axis_labels("k", "pass@k (%)")
    g.set_titles("{col_name}", size=9)
    integer_ticks(*g.axes.flat)
    return show(g.figure, with_source("Unbiased pass@k (%) against k, Base and each CTRLS row, one panel per backbone, "
                                "dataset and temperature η.", source))


def pair_title(pair: str) -> str:
    """A run directory's pair name as a reader's title: ``SmolLM2-135M__word_problems`` ->
    "SmolLM2-135M, word problems"."""
    backbone, _, dataset = str(pair).partition("__")
    return f"{backbone}, {dataset.replace('_', ' ')}" if dataset else backbone


def learning_curves(curves: pd.DataFrame, y: str = "accuracy", kind: str = "eval", ylabel: str | None = None,
                    smooth: int = 1, source: str = "") -> plt.Figure:
    """A metric against RL step, mean and band over seeds, one panel per (backbone, dataset)."""
    # Fig.: the on-policy learning curves (appendix figures "On-policy learning curves")
    d = curves[curves.kind == kind].copy()
    d["pair"] = d["pair"].map(pair_title)  # panel titles, not directory names
    if smooth > 1:
        d[y] = d.groupby(["pair", "setting", "seed"])[y].transform(lambda v: v.rolling(smooth, min_periods=1).mean())
    what = ylabel or y
    note = all_equal_note(d[y], f"{what} during RL")
    if note:
        return say(note)
    g = sns.relplot(data=d, x="step", y=y, hue="setting", col="pair", kind="line", errorbar=("pi", 100),
                    height=3.4, aspect=1.25, facet_kws={"sharey": False}, marker="o" if kind == "eval" else None)
    g.set_axis_labels("RL step", what)
    g.set_titles("{col_name}", size=9)
    integer_ticks(*g.axes.flat)
    seeds = d.seed.nunique() if "seed" in d else 1
    smoothed = f", {smooth}-step moving average" if smooth > 1 else ""
    return show(g.figure, with_source(f"{what[0].upper() + what[1:]} during RL ({'held-out evaluation' if kind == 'eval' else 'training'}"
                                f"{smoothed}) against the RL step, per setting: mean and min–max band over "
                                f"{seeds} seed{'s' if seeds != 1 else ''}, one panel per backbone and dataset.", source))


def controls(summary: pd.DataFrame) -> plt.Figure:
    """The held-out log P per token of each control condition minus the backbone alone, with its
    paired 95% interval over questions (``ctrls.stages.pretrain.controls_summary``)."""
    t = summary[summary.condition != "no adapter"].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(t) + 1.2))
    y = np.arange(len(t))[::-1]
    err = np.array([t.delta - t.delta_lo, t.delta_hi - t.delta]).clip(min=0)
    ax.errorbar(t.delta, y, xerr=np.nan_to_num(err), fmt="o", color="C0", capsize=3)
    ax.axvline(0, color="0.4", lw=1)
    ax.set_yticks(y, t.condition)
    ax.set_xlabel("held-out log P per token, minus the backbone alone (nats)")
    fig.tight_layout()
    return fig


def steering_scaling(df: pd.DataFrame) -> plt.Figure:
    """Left: the epsilon row's steps that land in the state they were drawn for, and the coincidence
    reference (Base steps paired with drawn chains), against training chains. Right: pass@1 of the
    fixed-s0 and the epsilon rows minus Base's. 95% intervals (``ctrls.report.studies.scaling_frame``)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 3.6))
    x = df.chains.to_numpy()
    # one series per K when the points have several (solid, circles: the first K; dashed, squares: the next)
    ks = sorted(df.K.dropna().unique(), reverse=True) if "K" in df and df.K.nunique() > 1 else [None]
    for i, kk in enumerate(ks):
        d = df if kk is None else df[df.K == kk]
        xs, tag, fmt = d.chains.to_numpy(), "" if kk is None else f" (K = {int(kk)})", ("o-", "s--", "^:")[i % 3]
        for ax, series in ((a, (("follows", "ε row follows its state", "C0", 1.0), ("coincidence", "coincidence (Base)", "C7", 1.06))),
                           (b, (("harm", "fixed s0 − Base", "C3", 1.0), ("eps_vs_base", "ε − Base", "C0", 1.06)))):
            for col, label, c, dx in series:
                ax.errorbar(xs * dx * (1.0 + 0.12 * i), 100 * d[col],
                            yerr=100 * np.array([d[col] - d[f"{col}_lo"], d[f"{col}_hi"] - d[col]]).clip(0),
                            fmt=fmt, color=c, capsize=3, label=label + tag)
    a.set_ylabel("% of steps")
    b.axhline(0, color="0.4", lw=1)
    b.set_ylabel("pass@1 difference (points)")
    for ax in (a, b):  # intervals side by side (each next series 6%, each next K 12% to the right), ticks at the measured sizes
        ax.set_xscale("log")
        ax.set_xticks(sorted(set(x)), [str(int(v)) for v in sorted(set(x))])
        ax.minorticks_off()
        ax.set_xlabel("training chains")
        ax.legend(frameon=False, loc="best", fontsize="small" if len(ks) > 1 else None)
    fig.tight_layout()
    return fig
