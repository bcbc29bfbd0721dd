"""The findings the book's first page opens with: at most five, in this order, each with its
direction and size, written at build time from the runs and from the paper's own tables, never typed:

1. what the paper's Tables 1 and 2 can and cannot show (``ctrls.stats.power``), with a forest plot of
   their CTRLS − Base differences against their minimal detectable difference (:func:`paper_forest`);
2. what CTRLS does to pass@n on this build's runs (Table 1), and the adapter alone (fixed s0 − Base);
3. whether steps follow the state they were generated under (controllability), and what the stored
   mechanism studies (more training chains, other injection points) found (:func:`mechanism_note`);
4. what RL on the transition policy does to held-out accuracy;
5. what ran at the paper's 3B scale, the one command that runs it, and its measured GPU-hours for
   one backbone × dataset (``bench/results/gpu_estimate_measured_nvidia_h200_qwen.json``).

Findings 2 to 4 are the scorecard's own claims (``ctrls.report.scorecard``): the same estimates, the
same family intervals, the same verdicts. ``ctrls reproduce`` writes ``<book>/generated/findings.md``
and the figure beside it after the notebooks (:func:`write_findings`); the intro page includes it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from ctrls.config.schema import Config
from ctrls.report.paper import PAPER_TABLE2
from ctrls.report.verdicts import NOT_SUPPORTED, Claim

ROOT = Path(__file__).resolve().parents[2]
GPU_RESULT = ROOT / "bench" / "results" / "gpu_estimate_measured_nvidia_h200_qwen.json"
FOREST = "paper_forest.png"  # written beside findings.md
PAPER_BACKBONES = tuple(PAPER_TABLE2)  # the paper's 3B backbones


# ---- 1. the paper's own tables ------------------------------------------------------------------


def _row_label(r) -> str:
    bb = str(r["backbone"]).split("/")[-1].replace("-Instruct", "")
    eta = "" if pd.isna(r["temperature"]) else f" η={r['temperature']:g}"
    return f"{bb} {r['dataset']}{eta} {r['config']} {r['metric']}"


def paper_forest(pw: pd.DataFrame):
    """A forest plot of the paper's CTRLS − Base differences (``ctrls.stats.power.paper_power``), one panel
    per table: each difference with its 95% Newcombe interval (points), over a grey band from −MDD
    down to +MDD up, the smallest change from Base its test detects with power 0.8 at the paper's n
    (to the edge where no rate is detectable). Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt  # headless outside a kernel: matplotlib falls back to Agg

    tables = list(dict.fromkeys(pw["table"]))
    rows = max(int((pw["table"] == t).sum()) for t in tables)
    fig, axes = plt.subplots(1, len(tables), figsize=(9.4, 1.2 + 0.14 * rows), squeeze=False)
    for ax, table in zip(axes[0], tables):
        g = pw[pw["table"] == table].reset_index(drop=True)
        y = [rows - 1 - i for i in range(len(g))]  # top-aligned, in the table's order
        up = g["MDD up (pp)"].fillna(100 - g["base (%)"])  # no detectable gain: the band reaches 100%
        down = g["MDD down (pp)"].fillna(g["base (%)"])
        ax.barh(y, up + down, left=-down, height=0.8, color="0.88", label="not detectable (±MDD)")
        below = g["below MDD"].astype(bool)
        colours = ["tab:blue" if b else "tab:red" for b in below]
        ax.errorbar(g["diff (pp)"], y, xerr=[g["diff (pp)"] - g["lo (pp)"], g["hi (pp)"] - g["diff (pp)"]],
                    fmt="none", ecolor=colours, elinewidth=0.9)
        ax.scatter(g["diff (pp)"], y, c=colours, s=9, zorder=3, label="CTRLS − Base, 95% CI")
        ax.axvline(0, color="0.3", lw=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels([_row_label(r) for _, r in g.iterrows()], fontsize=5.5)
        ax.set_ylim(-0.7, rows - 0.3)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlabel("points", fontsize=7)
        ax.set_title(f"{table} (n = {int(g['n'].iloc[0])} questions)", fontsize=8)
        ax.grid(axis="y", visible=False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def paper_finding(counts: dict) -> str:
    """Finding 1, from ``ctrls.report.scorecard.paper_power_counts``."""
    t = counts["tables"]
    per = "; ".join(
        (f"{name} (n = {v['n']}): none of its {v['differences']} differences is resolvable under any pairing of its "
         f"questions" if v["best"] == 0 else
         f"{name} (n = {v['n']}): between {v['worst']} and {v['best']} of its {v['differences']} differences could be "
         f"resolved, depending on per-question outcomes the paper does not publish")
        for name, v in t.items())
    mdd = ", ".join(f"{v['median MDD up']:.1f} points in {name}" for name, v in t.items())
    head = ("The paper's own tables cannot show that CTRLS beats Base" if counts["excluding 0"] == 0 else
            "The paper's own tables show some CTRLS − Base differences")
    return (f"**{head}.** Of its {counts['n']} CTRLS − Base differences (Tables 1 and 2, pass@20 and Succ.), "
            f"{counts['up']} point up (↑), {counts['down']} down (↓) and {counts['zero']} are zero; the largest is "
            f"{counts['largest']:+.1f} points. {counts['excluding 0']} of {counts['n']} have a 95% interval that "
            f"excludes 0, and {counts['below MDD']} are smaller than the minimal detectable difference at the paper's "
            f"n (median MDD up from Base: {mdd}). {per}.")


# ---- 2-4. the demo, from the scorecard's claims ---------------------------------------------------


HEADS = {  # claim -> {verdict label: the finding's headline}
    "pass": {"supported": "CTRLS raises pass@n over Base", "contradicted": "CTRLS lowers pass@n below Base",
             NOT_SUPPORTED: "CTRLS does not detectably change pass@n", "mixed": "CTRLS's pass@n goes both ways"},
    "control": {"supported": "Steps follow the state they were generated under",
                "contradicted": "Steps follow their sampled state less often than chance pairing",
                NOT_SUPPORTED: "Steps do not detectably follow their sampled state",
                "mixed": "Whether steps follow their state goes both ways"},
    "rl": {"supported": "RL on the transition policy raises held-out accuracy",
           "contradicted": "RL on the transition policy lowers held-out accuracy",
           NOT_SUPPORTED: "RL on the transition policy does not detectably change held-out accuracy",
           "mixed": "RL goes both ways across settings"},
}


def _sized(c: Claim) -> str:
    """The claim's estimates with the verdict and, where unresolved, the demo's MDD."""
    label = c.label
    mdd = (f"; the demo detects about {c.mdd:.0f} points at 80% power" if c.mdd is not None and not math.isnan(c.mdd)
           and label == NOT_SUPPORTED else "")
    return f"Claimed {c.claimed}; found {c.found().split(' (detectable')[0]} (*{label}*{mdd})"


def _claim_finding(c: Claim | None, key: str, what: str, extra: str = "") -> str:
    if c is None:
        return f"**{what}: not run.**"
    head = HEADS[key].get(c.label)
    if head is None:  # not run, no comparison, unreadable: the state and why
        return f"**{what}: {c.label}.** {c.found()}"
    return f"**{head}** ({{doc}}`/{c.page}`). {_sized(c)}.{extra}"


def demo_findings(claims: list[Claim]) -> list[str]:
    """Findings 2 to 4 from the scorecard's claims (``ctrls.report.scorecard.scorecard``)."""
    from ctrls.report.scorecard import (
        ABLATION_CLAIM,
        CONTROL_CLAIM,
        PASS_CLAIM,
        RL_CLAIM,
    )

    by = {c.claim: c for c in claims}
    ab = by.get(ABLATION_CLAIM)
    alone = ""
    if ab is not None and ab.beside:
        alone = (" The adapter alone, holding one state (fixed s0 − Base): "
                 + "; ".join(e.text(label=len(ab.beside) > 1) for e in ab.beside) + ".")
    if ab is not None and ab.estimates:
        alone += f" The transitions beyond the adapter ({ab.claimed}): {ab.found().split(' (detectable')[0]} (*{ab.label}*)."
    ct = by.get(CONTROL_CLAIM)
    held = ""
    if ct is not None and ct.beside:
        held = (" Holding one state (fixed s0), steps stay in it vs Base steps: "
                + "; ".join(e.text(label=len(ct.beside) > 1) for e in ct.beside) + ".")
    return [_claim_finding(by.get(PASS_CLAIM), "pass", "Table 1", alone),
            _claim_finding(ct, "control", "controllability", held + mechanism_note()),
            _claim_finding(by.get(RL_CLAIM), "rl", "RL, Table 2")]


def mechanism_note(scaling: Path | None = None, injection: Path | None = None, states: Path | None = None,
                   fusion: Path | None = None) -> str:
    """Finding 3's second half, from the stored mechanism studies (the pretraining page): whether fewer,
    coarser states (``studies/steering.py --n-states``), more training chains (``studies/steering.py``),
    another injection point (``studies/injection.py``) or a token-dependent F_u (``adapter.fusion: mlp``,
    paired with the K sweep) makes the steps follow their drawn state, each rate beside its coincidence
    reference (and, for the K sweep, Cohen's kappa), and whether any reaches the steering goal
    (``ctrls.report.studies.STEERING_GOAL``); "" when none is stored. With no path given, the stored results."""
    from ctrls.report.studies import (
        STEERING_GOAL,
        chance_corrected,
        fusion_frame,
        fusion_result_path,
        injection_frame,
        injection_result_paths,
        scaling_frame,
        scaling_result_paths,
        states_result_path,
        steering_k,
    )
    from ctrls.report.verdicts import page_link

    if fusion is None and states is None:  # the stored comparison pairs with the stored sweep only
        fusion = fusion_result_path()
    scaling = scaling if scaling is not None else (scaling_result_paths() or None)
    states = states if states is not None else states_result_path()
    parts, frames = [], []
    if states is not None:
        ks = scaling_frame(states).sort_values("K")
        frames.append(ks)
        kappa = chance_corrected(ks.follows, ks.coincidence)
        rates = ", ".join(f"{100 * r.follows:.1f}% at K = {int(r.K)} ({100 * r.coincidence:.1f}%; κ = {kp:.2f})".replace("-", "−")
                          for (_, r), kp in zip(ks.iterrows(), kappa))
        parts.append(f"with K states, the ε row's steps follow their drawn state {rates} (`studies/steering.py --n-states`)")
    if scaling is not None:
        sc = scaling_frame(scaling)
        frames.append(sc)
        several = sc.K.nunique() > 1
        rates = ", ".join(f"{100 * r.follows:.1f}% at {r.chains} chains{f' and K = {int(r.K)}' if several else ''} "
                          f"({100 * r.coincidence:.1f}%)" for _, r in sc.iterrows())
        parts.append(f"with more training chains ({', '.join(sorted(set(sc.sources)))}), the ε row's steps follow "
                     f"their drawn state {rates} (`studies/steering.py`)")
    for path in ([injection] if injection is not None else injection_result_paths()):
        inj = injection_frame(path)
        frames.append(inj)
        at_k = f" at K = {inj.attrs['K']}" if inj.attrs.get("K") else ""
        rates = ", ".join(f"{100 * r.follows:.1f}% injected at the {r.injection.split(' (')[0]}{at_k} "
                          f"({100 * r.coincidence:.1f}%)" for _, r in inj.iterrows())
        parts.append(f"in the injection harness (its rows compare with each other only) {rates} (`studies/injection.py`)")
    if fusion is not None and states is not None:
        fu = fusion_frame(states, fusion)
        mlp = fu[fu.fusion != "linear"]
        frames.append(mlp)
        rates = ", ".join(f"{100 * r.follows:.1f}% at K = {int(r.K)} ({100 * r.coincidence:.1f}%)" for _, r in mlp.iterrows())
        parts.append(f"with a token-dependent F_u (`adapter.fusion: mlp`), {rates}")
    if not parts:
        return ""
    f, k = STEERING_GOAL
    met = sum(int(((d.follows >= f) & (d.follows >= k * d.coincidence)).sum()) for d in frames)
    best = ""
    if states is not None and len(ks):
        top = steering_k(ks)  # the pretraining page's rule
        best = (f" By κ, which does not favour many states, K = {int(top.K)} steers most (κ = {top.kappa:.2f}; "
                f"{k:g}× coincidence would need {100 * k * top.coincidence:.0f}% there).")
    return (f" Mechanism studies ({page_link('generated/01_pretraining')}; in parentheses, the rate by coincidence): "
            + "; ".join(parts) + ". " + (f"{met} of these variants reach{'es' if met == 1 else ''}" if met else "None reaches")
            + f" the {100 * f:.0f}% and {k:g}× coincidence that steering would need." + best)


# ---- 5. the paper's scale -----------------------------------------------------------------------


def scale_finding(cfg: Config, path: Path = GPU_RESULT) -> str:
    """Finding 5: whether this build ran a paper backbone, the command that does, and the measured
    GPU-hours of one backbone × dataset (the captured decode path, judge excluded)."""
    ran = [b for b in cfg.grid.backbones if b.split("/")[-1] in PAPER_BACKBONES]
    head = (f"**This build ran the paper's backbone(s) {', '.join(ran)}.**" if ran else
            f"**Nothing in this build ran at the paper's 3B scale**: its backbone is {', '.join(cfg.grid.backbones)} "
            f"(profile `{cfg.profile}`), and every number above comes from it.")
    cmd = "The paper's setting is one command, `ctrls reproduce --profile paper`."
    if not Path(path).is_file():
        return f"{head} {cmd} Its GPU-hours are not measured in this checkout ({Path(path).name} is missing)."
    d = json.loads(Path(path).read_text())
    g = d["estimate_graph"]
    pair, h = next(iter(g["pairs_hours"].items()))
    backbone, dataset = pair.rsplit(" / ", 1)
    gpu = d["environment"]["gpu"].replace("NVIDIA ", "")
    t = g["total_hours"]
    return (f"{head} {cmd} For one backbone × dataset, "
            f"`ctrls reproduce --profile paper -o \"grid.backbones=[{backbone}]\" \"grid.datasets=[{dataset}]\"` "
            f"was measured at **{h['mean']:.1f}–{h['cap']:.1f} {gpu}-hours** on one GPU "
            f"({len(g['pairs_hours'])} datasets of that backbone: {t['mean']:.1f}–{t['cap']:.1f} h; decode steps "
            f"captured as CUDA graphs, a random-weight model of the backbone's full shape, the judge excluded; "
            f"{{doc}}`/gpu_cost`).")


def pair_markdown(path: Path = GPU_RESULT) -> str:
    """The paper profile's command for one backbone × dataset and its measured hours (the run-your-own page)."""
    if not Path(path).is_file():
        return f"The paper profile's GPU-hours are not measured in this checkout ({Path(path).name} is missing).\n"
    d = json.loads(Path(path).read_text())
    g = d["estimate_graph"]
    gpu = d["environment"]["gpu"].replace("NVIDIA ", "")
    lines = ["```bash", "make setup"]
    pairs = list(g["pairs_hours"].items())
    for pair, _ in pairs[:1]:
        backbone, dataset = pair.rsplit(" / ", 1)
        lines.append(f".venv/bin/ctrls reproduce --profile paper -o \"grid.backbones=[{backbone}]\" \"grid.datasets=[{dataset}]\"")
    lines += ["```", "", f"Measured on one {gpu} (`{GPU_RESULT.relative_to(ROOT)}`; decode steps captured as CUDA "
              "graphs, a random-weight model of the backbone's full shape, the judge excluded), in GPU-hours from "
              "'mean' (every batch decodes the assumed mean chain length) to 'cap' (every batch decodes "
              "`sampling.max_new_tokens`):", ""]
    many = d.get("estimate_graph_8gpu", {})
    eight = many.get("pairs_hours", {})
    lines += [f"| backbone × dataset | one GPU | {many.get('world_size', 'several')} GPUs, wall hours |", "|---|---:|---:|"]
    for pair, h in pairs:
        e = eight.get(pair)
        lines.append(f"| {pair} | {h['mean']:.1f}–{h['cap']:.1f} | "
                     + (f"{e['mean']:.1f}–{e['cap']:.1f} |" if e else "not estimated |"))
    return "\n".join(lines) + "\n"


KEYS = (  # (dotted key, symbol, what it is, guidance for a new model: words only, the values come from the profiles)
    ("states.n_states", "K", "latent states (k-means centroids)",
     "the paper's value for 3B models; with few training chains lower it until the pretraining page shows no "
     "empty or one-step states (fewer distinct steps than K reduce it, recorded)"),
    ("spectral.k", "k", "eigen-directions of each step's Gram matrix kept (Eq. 5)",
     "small k groups steps by reasoning move, larger k by content: read the pretraining page's granularity table"),
    ("states.tau", "τ", "soft-assignment temperature of a step to the centroids",
     "leave unset (the median rule scales it to the data's distances); set it only when the assignments come out "
     "all hard or all uniform"),
    ("adapter.rank", "r", "the U-Net adapter's bottleneck width (Eq. 8)",
     "grows with the backbone's hidden size; the paper profile's value is for 3B models"),
    ("pretrain.epochs", "", "at most this many adapter epochs, stopped early on the held-out bound",
     "raise it while the held-out bound still falls (pretraining page); `pretrain.patience` stops it"),
    ("grid.n_samples", "n", "samples per question (pass@n)", "the paper profile's value is the paper's pass@n; fewer samples lower pass@n"),
)


def config_keys_markdown() -> str:
    """The config keys that matter for a new model, with their defaults and the demo's and paper's
    values read from the profiles (``ctrls/config/schema.py``, ``ctrls/config/profiles/*.yaml``)."""
    from ctrls.config.schema import Config, load_config

    cfgs = {"default": Config(), "demo": load_config("demo"), "paper": load_config("paper")}

    def get(c, k):
        for part in k.split("."):
            c = getattr(c, part)
        return "unset" if c is None else f"{c:g}" if isinstance(c, float) else str(c)

    rows = ["| key | | what it is | default | `demo` | `paper` | for a new model |", "|---|---|---|---:|---:|---:|---|"]
    for k, sym, what, guide in KEYS:
        rows.append(f"| `{k}` | {sym} | {what} | {get(cfgs['default'], k)} | {get(cfgs['demo'], k)} | "
                    f"{get(cfgs['paper'], k)} | {guide} |")
    return "\n".join(rows) + "\n"


# ---- the page ------------------------------------------------------------------------------------


def findings(cfg: Config, claims: list[Claim], counts: dict, gpu_result: Path = GPU_RESULT) -> list[str]:
    """The five findings, in order (module docstring)."""
    return [paper_finding(counts), *demo_findings(claims), scale_finding(cfg, gpu_result)]


def findings_markdown(items: list[str], figure: str | None = None) -> str:
    """A numbered list of the findings, with the forest plot (its provenance in the caption) after the first."""
    out = [f"1. {items[0]}", ""]
    if figure:
        out += [f"   ```{{figure}} {figure}", "   :name: fig-paper-forest", "   :width: 100%", "",
                "   The paper's CTRLS − Base differences (dots, 95% Newcombe intervals at the paper's n) against the "
                "band no test at that n detects with power 0.8 (grey, ±MDD from Base); red: a difference larger than "
                "its MDD. Drawn by `ctrls.report.findings.paper_forest(ctrls.stats.power.paper_power())` from the paper's Tables 1 "
                "and 2 (`ctrls/report/paper.py`).", "   ```", ""]
    out += [f"{i}. {s}" for i, s in enumerate(items[1:], 2)]
    return "\n".join(out) + "\n"


def write_findings(cfg: Config, book: Path, claims: list[Claim] | None = None) -> Path:
    """Write ``<book>/generated/findings.md`` and its forest plot from the runs of ``cfg`` (the
    scorecard's claims, computed here when not given)."""
    from ctrls.report.scorecard import paper_power_counts, scorecard
    from ctrls.stats import power

    out = Path(book) / "generated"
    out.mkdir(parents=True, exist_ok=True)
    claims = scorecard(cfg) if claims is None else claims
    pw = power.paired_p_columns(power.paper_power())
    fig = paper_forest(pw)
    fig.savefig(out / FOREST, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    path = out / "findings.md"
    path.write_text(findings_markdown(findings(cfg, claims, paper_power_counts(pw)), f"/generated/{FOREST}"))
    (out / "paper_pair.md").write_text(pair_markdown())  # the run-your-own page's
    (out / "config_keys.md").write_text(config_keys_markdown())
    return path


__all__ = ["config_keys_markdown", "demo_findings", "findings", "findings_markdown", "pair_markdown", "paper_finding",
           "paper_forest", "scale_finding", "write_findings"]
