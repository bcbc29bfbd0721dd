"""The book's figures (seaborn/matplotlib). Each function returns the matplotlib Figure.

In a notebook, each figure is shown by :func:`show` with a numbered caption that says what it
shows and ends with where it was drawn from: the library call and the run files it read
(:func:`drawn_from`, passed to each figure function as ``source``). A figure whose every plotted value
is equal is replaced by one sentence that says so (:func:`all_equal_note`), computed from the data.

**Numbering.** The book's figures are numbered "Figure B<page>.<n>" (:func:`caption`): ``B`` for the
book, the page's number (the first page is 0; a notebook's page is its number plus one, so
``01_pretraining`` is page 2), then the figure's number on that page. A page sets its number once (:func:`set_page`, called by
``ctrls.report.provenance.show_provenance``). No number of the book can be mistaken for one of the
paper's Figures 1 to 7.

**Legibility.** Every text of a figure is at least :data:`MIN_FONT_PT` points, and no figure is wider
than :data:`MAX_WIDTH_IN` inches at 100 dpi. The book's stylesheet scales every figure to its column, so
that none is cut off on a 390 px phone (``book/_static/ctrls.css``; ``tests/report/test_plots_legibility.py``).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from matplotlib.ticker import MaxNLocator

MIN_FONT_PT = 10  # the smallest text of any figure
sns.set_theme(context="notebook", style="whitegrid", rc={"legend.fontsize": 11, "legend.title_fontsize": 11})

_FIGURES = [0]  # figures shown on this page (one kernel per page)
_PAGE = ["B"]  # this page's figure prefix: "B<page>" once set_page has run
# The book's content column is 948 px wide at 1280 px; at 100 dpi a figure at most this many inches
# wide is shown at its own size, never downscaled (ctrls.report.synthetic_figures uses the same width).
MAX_WIDTH_IN = 9.3


def _kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def page_prefix(page: str | int) -> str:
    """The figure prefix of a notebook's page: ``"01_pretraining"`` or ``1`` -> ``"B2"``. Page 0, ``"B0"``, is
    the book's first page (``ctrls.report.findings.FIGURE``), which is not a notebook."""
    m = re.match(r"\s*(\d+)", str(page))
    if m is None:
        raise ValueError(f"a page is named by its number or its notebook's name ('01_pretraining'), got {page!r}")
    return f"B{int(m.group(1)) + 1}"


def set_page(page: str | int) -> str:
    """Number this notebook page's figures "Figure B<page>.<n>" from 1 (:func:`page_prefix`); returns the prefix."""
    _PAGE[0] = page_prefix(page)
    _FIGURES[0] = 0
    return _PAGE[0]


def caption(text: str) -> str:
    """The next figure's caption: "**Figure B2.2.** text" (page 2, its second figure)."""
    _FIGURES[0] += 1
    return f"**Figure {_PAGE[0]}.{_FIGURES[0]}.** {text}"


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
                     "file (pass run_dir=cfg.run_dir) or a file of the repository")


def drawn_from(call, *paths, run_dir=None) -> str:
    """The provenance sentence that ends a figure's caption: the library call that drew it and the
    files it read, e.g. "Drawn by `ctrls.report.plots.pass_at_k_curves` from `demo/exploration/samples.parquet/`."

    ``call``: the figure function (or its dotted name). ``paths``: the files read, as the stage
    modules compute them (a glob pattern names a family of files); each is shown relative to
    ``run_dir`` (``cfg.run_dir``: so ``<profile>/<stage>/<file>``) or, for a file of the repository
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
    stage, name = PRETRAIN_FILES[method]
    return Path(run.dir(stage) if hasattr(run, "dir") else Path(run.root) / stage) / name


def rl_curve_files(cfg) -> Path:
    """The RL curves ``ctrls.stages.rl.load_curves`` reads, as one glob pattern
    (``<run_dir>/<profile>/rl/<pair>/<run>/curve.parquet``)."""
    from ctrls.stages.rl import rl_stage

    return rl_stage(cfg).dir / "*" / "*" / "curve.parquet"


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


def _epochs_note(history: pd.DataFrame) -> tuple[set, str]:
    """The splits evaluated at fewer than three epochs (drawn as points, not lines: two points joined by a
    line would read as a curve that was measured in between), and the caption's words for them."""
    few = {split: sorted(int(e) for e in g.epoch.unique()) for split, g in history.groupby("split", sort=False)
           if g.epoch.nunique() < 3}
    words = " ".join(f"The {split} steps were evaluated at epoch{'s' if len(e) > 1 else ''} "
                     f"{' and '.join(map(str, e))} only, so they are drawn as points, not as a line."
                     for split, e in few.items())
    return set(few), (f" {words}" if words else "")


def bound_curve(history: pd.DataFrame, kl_history: pd.DataFrame | None = None, source: str = "") -> plt.Figure:
    """Thm. 5.3's bound (solid, with its 95% interval over questions) and the relaxed training
    objective (dashed) over adapter-training epochs, per split (``PretrainRun.bound_history``;
    epoch 0 = the fresh adapter = the frozen backbone), and the transition fit of stage (e). A split
    evaluated at fewer than three epochs is drawn as points with error bars, never as a line.

    Two figures, each shown with its caption (ending with ``source``): the bound per step and its
    reconstruction term; the KL term and the transition fit. When every line of the second is flat
    (each its own value at every epoch, and the fit one value), it is one computed sentence instead
    (:func:`all_equal_note`). Returns the second figure (None when it is a sentence)."""
    # a closed-form transition fit is one number: said in the caption, not drawn as a one-point panel
    fit_panel = kl_history is not None and pd.to_numeric(kl_history.kl, errors="coerce").nunique() > 1
    points, few_words = _epochs_note(history)
    fig, axes = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 3.8))
    fig2, axes2 = plt.subplots(1, 2 if fit_panel else 1, figsize=(MAX_WIDTH_IN if fit_panel else 5.5, 3.8), squeeze=False)
    axes2 = axes2[0]
    panels = [("elbo_per_step", "relaxed_per_step", "ELBO and relaxed objective", "nats / step"),
              ("rec_per_token", "relaxed_rec_per_token", "reconstruction", "nats / token"),
              ("kl_per_step", "mixture_kl_per_step", "KL term", "nats / step")]
    for ax, (solid, dashed, title, ylabel) in zip([*axes, axes2[0]], panels):
        for i, (split, g) in enumerate(history.sort_values("epoch").groupby("split", sort=False)):
            line = split not in points
            ax.plot(g.epoch, g[solid], marker="o", ls="-" if line else "none", color=f"C{i}", label=f"{split}: Thm. 5.3")
            ax.plot(g.epoch, g[dashed], ls="--" if line else "none", marker="s" if not line else ".",
                    mfc="none" if not line else None, color=f"C{i}", label=f"{split}: relaxed")
            if solid == "elbo_per_step":
                if line:
                    ax.fill_between(g.epoch, g.elbo_per_step_lo, g.elbo_per_step_hi, color=f"C{i}", alpha=0.15, lw=0)
                else:
                    ax.errorbar(g.epoch, g[solid], yerr=np.array([g[solid] - g.elbo_per_step_lo,
                                                                  g.elbo_per_step_hi - g[solid]]).clip(0),
                                fmt="none", ecolor=f"C{i}", capsize=3)
        ax.set(title=title, xlabel="adapter-training epoch", ylabel=ylabel)
        integer_ticks(ax)
    axes[0].legend(fontsize=MIN_FONT_PT)
    axes2[0].legend(fontsize=MIN_FONT_PT)
    splits = " and ".join(history.split.drop_duplicates().astype(str))
    fig.tight_layout()
    show(fig, with_source(f"Thm. 5.3's bound (solid; band or bars: 95% interval over questions) and the relaxed "
                          f"training objective (dashed) over adapter-training epochs, on the {splits} steps. "
                          "Left: per step; right: its reconstruction term per token. Epoch 0 is the fresh adapter, "
                          f"i.e. the frozen backbone.{few_words}", source))
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
                f"{epochs} evaluated epoch{'s' if epochs != 1 else ''} (nats per step: {values})")
        if kl_history is not None:
            mixture = "objective" in kl_history and (kl_history.objective == "mixture").all()
            text += (f". The transition fit (stage e) reached a mean {'mixture-prior' if mixture else 'expected'} "
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
    axes[0].set_xticks(ticks + 0.5, [str(t) for t in ticks], rotation=0, fontsize=MIN_FONT_PT + 1)
    axes[0].set_yticks(ticks + 0.5, [str(t) for t in ticks], rotation=0, fontsize=MIN_FONT_PT + 1)
    axes[0].set(title=rf"transition matrix $\mathrm{{softmax}}(L)$, $K = {K}$", xlabel="next state $j$", ylabel="state $i$")
    counts = states.value_counts().reindex(range(K), fill_value=0)
    sns.barplot(x=np.arange(K), y=counts.to_numpy(), ax=axes[1], color="C0")
    axes[1].set(title="cluster sizes (training steps per state)", xlabel="state", ylabel="steps")
    axes[1].set_xticks(ticks, [str(t) for t in ticks], rotation=0, fontsize=MIN_FONT_PT + 1)
    for ax in axes:
        ax.title.set_fontsize(MIN_FONT_PT + 1)
    fig.tight_layout()
    return show(fig, with_source(f"Left: the fitted transition matrix softmax(*L*) over the K = {K} latent states "
                     f"(row i: the distribution of the next state after state i). Right: the number of training "
                     f"steps assigned to each state ({int(counts.sum())} in all; "
                     f"{int((counts == 0).sum())} states unused).", source))


def pass_at_k_curves(curves: pd.DataFrame, source: str = "") -> plt.Figure:
    """Unbiased pass@k (%) vs k, Base and each CTRLS row, one panel per (backbone, dataset, eta). A panel
    whose every value is equal (a flat line, e.g. 0% on a dataset the backbone cannot solve) is left out
    and said in one sentence; each row has its own line style and marker, so no row hides under another."""
    note = all_equal_note(curves.pass_at_k, "pass@k", "%", 100)
    if note:
        return say(note + " (every row, every k).")
    curves = curves.assign(panel=curves.backbone.str.split("/").str[-1] + " · " + curves.dataset + " · η=" +
                           curves.temperature.astype(str), pass_at_k=100 * curves.pass_at_k)
    flat = {p: g.pass_at_k.iloc[0] for p, g in curves.groupby("panel", sort=False) if _flat(g.pass_at_k).nunique() == 1}
    if flat:
        say("Not drawn, because every row's pass@k is the same at every k: "
            + "; ".join(f"{p} ({v:.3g}% for every row and k)" for p, v in flat.items()) + ".")
    curves = curves[~curves.panel.isin(flat)]
    order = ["Base", *[c for c in dict.fromkeys(curves.config) if c != "Base"]]
    g = sns.relplot(data=curves, x="k", y="pass_at_k", hue="config", style="config", hue_order=order, style_order=order,
                    col="panel", kind="line", markers=True, dashes=True, markersize=7, height=3.6, aspect=1.15,
                    facet_kws={"sharey": False})
    g.set_axis_labels("k", "pass@k (%)")
    g.set_titles("{col_name}", size=MIN_FONT_PT + 1)
    integer_ticks(*g.axes.flat)
    return show(g.figure, with_source("Unbiased pass@k (%) against k, Base and each CTRLS row (one line style and "
                                      "marker each), one panel per backbone, dataset and temperature η.", source))


def pair_title(pair: str) -> str:
    """A run directory's pair name as a reader's title: ``SmolLM2-135M__word_problems`` ->
    "SmolLM2-135M, word problems"."""
    backbone, _, dataset = str(pair).partition("__")
    return f"{backbone}, {dataset.replace('_', ' ')}" if dataset else backbone


def pooled_accuracy(g: pd.DataFrame) -> pd.DataFrame:
    """Held-out accuracy per RL step of one setting's evaluations (rows with ``correct_by_question`` and
    ``samples_per_question``), the seeds' samples pooled per question as the page's verdicts pool them,
    with its 95% Wilson interval at the question-clustered effective size
    (``ctrls.stats.metrics.rate_interval``): columns step, rate, lo, hi, samples."""
    from ctrls.stats.metrics import rate_interval

    rows = []
    for step, gg in g.groupby("step", sort=True):
        m = np.sum([np.asarray(x, float) for x in gg.correct_by_question], axis=0)
        n = np.full(len(m), float(gg.samples_per_question.sum()))
        r = rate_interval(m, n)
        rows.append({"step": step, "rate": r["rate"], "lo": r["lo"], "hi": r["hi"], "samples": int(n.sum())})
    return pd.DataFrame(rows)


def learning_curves(curves: pd.DataFrame, y: str = "accuracy", kind: str = "eval", ylabel: str | None = None,
                    smooth: int = 1, source: str = "", scale: float = 1.0,
                    reference: tuple[float, str] | None = None) -> plt.Figure:
    """A metric against the RL step, per setting, one panel per (backbone, dataset): each seed as a thin
    line, and, thick, held-out accuracy pooled over the seeds with its 95% interval (:func:`pooled_accuracy`;
    ``y="accuracy"`` of the evaluations) or else the mean over seeds. ``scale``: 100 shows a rate in %,
    as the tables do. ``reference``: (value, label) of a dashed line the axis always includes, e.g. log K,
    the largest entropy of a choice among K states."""
    # Fig.: the on-policy learning curves (appendix figures "On-policy learning curves")
    d = curves[curves.kind == kind].copy()
    d["pair"] = d["pair"].map(pair_title)  # panel titles, not directory names
    if smooth > 1:
        d[y] = d.groupby(["pair", "setting", "seed"])[y].transform(lambda v: v.rolling(smooth, min_periods=1).mean())
    what = ylabel or y
    note = all_equal_note(d[y], f"{what} during RL", scale=scale)
    if note:
        return say(note)
    pooled = y == "accuracy" and kind == "eval" and {"correct_by_question", "samples_per_question"} <= set(d)
    pairs, settings = list(dict.fromkeys(d["pair"])), list(dict.fromkeys(d.setting))
    fig, axes = plt.subplots(1, len(pairs), figsize=(min(MAX_WIDTH_IN, 1.5 + 4.6 * len(pairs)), 3.9), squeeze=False)
    for ax, pair in zip(axes[0], pairs):
        for i, setting in enumerate(settings):
            g = d[(d["pair"] == pair) & (d.setting == setting)].sort_values("step")
            if g.empty:
                continue
            colour = f"C{i}"
            for _, gs in g.groupby("seed"):
                ax.plot(gs.step, scale * gs[y], color=colour, alpha=0.35, lw=0.9)
            if pooled:
                p = pooled_accuracy(g)
                ax.errorbar(p.step, scale * p.rate, yerr=scale * np.array([p.rate - p.lo, p.hi - p.rate]).clip(0),
                            fmt="o-", color=colour, lw=2, capsize=4, label=setting)
            else:
                mean = g.groupby("step")[y].mean()
                ax.plot(mean.index, scale * mean.to_numpy(), color=colour, lw=2.2,
                        marker="o" if kind == "eval" else None, label=setting)
        if reference is not None:
            ax.axhline(reference[0], ls="--", color="0.3", lw=1.2, label=reference[1])
            ax.set_ylim(0, max(ax.get_ylim()[1], 1.08 * reference[0]))
        elif scale == 100:
            ax.set_ylim(bottom=0)
        ax.set(title=pair, xlabel="RL step", ylabel=what)
        ax.title.set_fontsize(MIN_FONT_PT + 1)
        integer_ticks(ax)
    axes[0][0].legend(fontsize=MIN_FONT_PT, title="setting", title_fontsize=MIN_FONT_PT)
    fig.tight_layout()
    seeds = d.seed.nunique() if "seed" in d else 1
    smoothed = f", {smooth}-step moving average" if smooth > 1 else ""
    thick = ("the seeds' samples pooled per question, with 95% Wilson intervals (question-clustered)" if pooled
             else f"the mean over the {seeds} seed{'s' if seeds != 1 else ''}")
    ref = f" Dashed: {reference[1]}." if reference is not None else ""
    return show(fig, with_source(f"{what[0].upper() + what[1:]} during RL "
                                 f"({'held-out evaluation' if kind == 'eval' else 'training'}"
                                 f"{smoothed}) against the RL step, per setting. Thick: {thick}; thin: each of the "
                                 f"{seeds} seed{'s' if seeds != 1 else ''}.{ref}", source))


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
    fig, (a, b) = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 4.8))
    x = df.chains.to_numpy()
    # one series per K when the points have several (solid, circles: the first K; dashed, squares: the next)
    ks = sorted(df.K.dropna().unique(), reverse=True) if "K" in df and df.K.nunique() > 1 else [None]
    for i, kk in enumerate(ks):
        d = df if kk is None else df[df.K == kk]
        xs, tag, fmt = d.chains.to_numpy(), "" if kk is None else f" (K = {int(kk)})", ("o-", "s--", "^:")[i % 3]
        for ax, series in ((a, (("follows", "ε row follows its state", "C0", 1.0),
                                ("coincidence", "coincidence (Base)", "C7", 1.06))),
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
        # under its panel: inside, it covered the points
        ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1 if len(ks) > 1 else 2,
                  fontsize=MIN_FONT_PT)
    fig.tight_layout()
    return fig
