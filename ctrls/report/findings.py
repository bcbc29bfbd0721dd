"""The book's first page: a three-sentence verdict, then at most five findings, filled at build time
with the numbers of the runs and of the paper's own tables. Their words are the book's, in
``book/_templates/findings.md`` (``ctrls.report.words.say``); this module computes the numbers and picks
the block where the wording depends on the data (a direction, a verdict).

The verdict (:func:`verdict_sentences`) says, in one sentence each, what the paper's tables can show,
what this build found, and at what scale it ran. The findings, in this order, each open with a headline
in bold and then give short sentences, every number with its 95% interval and its n, and a small table
where there are several numbers:

1. what the paper's Tables 1 and 2 can and cannot show (``ctrls.report.paper_power``), with a forest plot
   of their CTRLS − Base differences against their minimal detectable difference (:func:`paper_forest`);
2. what CTRLS does to pass@n on this build's runs (Table 1), the adapter alone (fixed s0 − Base) and the
   transitions beyond it (CTRLS − fixed s0);
3. whether steps land in the state they were generated under more often than by chance
   (controllability), and one sentence on the stored mechanism studies (:func:`mechanism_note`);
4. what RL on the transition policy does to held-out accuracy;
5. what ran at the paper's 3B scale, the one command that runs it, and its measured GPU-hours for one
   backbone × dataset (``bench/results/gpu_estimate_measured_nvidia_h200_qwen.json``).

Findings 2 to 4 are the scorecard's own claims (``ctrls.report.scorecard``; over training runs where the seeds
study is stored): the same estimates, intervals and verdicts. A finding's headline and the verdict's clause for it
are one string (:data:`HEADS`). ``ctrls reproduce`` writes ``<book>/generated/verdict.md``, ``findings.md`` and
the figure beside them after the notebooks (:func:`write_findings`); the intro page includes them.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ctrls.config.schema import Config
from ctrls.report import seeds_study, stored  # stored: the one validating reader of stored results
from ctrls.report.display import and_list
from ctrls.report.paper import PAPER_TABLE2
from ctrls.report.provenance import conditioning_name
from ctrls.report.verdicts import NOT_SUPPORTED, Claim
from ctrls.report.words import diff_ci, phrases, say

ROOT = Path(__file__).resolve().parents[2]
GPU_RESULT = ROOT / "bench" / "results" / "gpu_estimate_measured_nvidia_h200_qwen.json"
FOREST = "paper_forest.png"  # written beside findings.md
PAPER_BACKBONES = tuple(PAPER_TABLE2)  # the paper's 3B backbones
FIGURE = "B0.1"  # the first page's figure number: the book's own numbering never collides with the paper's
MAX_WORDS = 40  # no sentence of the first page is longer (tests/report/test_findings_page.py)


def _minus(s: str) -> str:
    return s.replace("-", "−")


# ---- 1. the paper's own tables ------------------------------------------------------------------
from ctrls.report.forest import FOREST_WIDTH_IN, paper_forest  # noqa: E402,F401 (paper_forest: the summary page draws it as findings.paper_forest)


def paper_tables(pw: pd.DataFrame) -> list[dict]:
    """Per paper table (``ctrls.report.paper_power.paired_p_columns``): its inferred n, its number of
    CTRLS − Base differences, how many point up, down or nowhere, the largest (signed), how many have a
    95% interval that excludes 0, how many an exact paired test could resolve under the most and the
    least favourable pairing of the questions, and the median MDD up from Base."""
    from ctrls.stats.power import ALPHA

    out = []
    for table, g in pw.groupby("table", sort=False):
        d = g["diff (pp)"]
        out.append({"table": table, "n": int(g["n"].iloc[0]), "differences": len(g), "up": int((d > 0).sum()),
                    "down": int((d < 0).sum()), "zero": int((d == 0).sum()), "largest": float(d.loc[d.abs().idxmax()]),
                    "excluding 0": int(g["excludes 0"].sum()), "below MDD": int(g["below MDD"].sum()),
                    "best": int((g["p, minimal discordance"] < ALPHA).sum()),
                    "worst": int((g["p, maximal discordance"] < ALPHA).sum()),
                    "median MDD up": float(g["MDD up (pp)"].median())})
    return out


def paper_table_markdown(pw: pd.DataFrame) -> str:
    """Finding 1's table: one row per paper table (:func:`paper_tables`)."""
    lines = [say("findings", "paper.table.head")]
    for t in paper_tables(pw):
        paired = say("findings", "paper.paired.none" if t["best"] == 0 else "paper.paired.some", **t)
        lines.append(say("findings", "paper.table.row", paired=paired, largest=_minus(format(t["largest"], "+.1f")),
                         excluding=t["excluding 0"], mdd=format(t["median MDD up"], ".1f"),
                         **{k: t[k] for k in ("table", "n", "differences", "up", "down", "zero")}))
    return "\n".join(lines) + "\n"


def paper_finding(counts: dict) -> str:
    """Finding 1's words, from ``ctrls.report.scorecard.paper_power_counts``: a headline and three short
    sentences (the counts, the inferred n, the MDDs); the per-table numbers are :func:`paper_table_markdown`."""
    t = counts["tables"]
    steps = " and ".join(say("findings", "paper.step", step=format(100 / v["n"], "g"), table=name, n=v["n"])
                         for name, v in t.items())
    mdds = " and ".join(say("findings", "paper.mdd", mdd=format(v["median MDD up"], ".1f"), table=name) for name, v in t.items())
    head = say("findings", "paper.head.none" if counts["excluding 0"] == 0 else "paper.head.some")
    return say("findings", "paper.finding", head=head, n=counts["n"], up=counts["up"], down=counts["down"],
               zero=counts["zero"], largest=_minus(format(counts["largest"], "+.1f")), excluding=counts["excluding 0"],
               below=counts["below MDD"], steps=steps, mdds=mdds)


# ---- 2-4. this build, from the scorecard's claims -------------------------------------------------


HEADS = {  # claim -> {verdict label: the finding's headline, and the verdict's clause for it}
    "pass": {"supported": "CTRLS raises pass@n over Base", "contradicted": "CTRLS lowers pass@n below Base",
             NOT_SUPPORTED: "CTRLS does not detectably change pass@n",
             "mixed": "CTRLS raises pass@n in some rows and lowers it in others"},
    "control": {"supported": "Steps land in their drawn state more often than by chance",
                "contradicted": "Steps land in their drawn state less often than by chance",
                NOT_SUPPORTED: "Steps do not detectably land in their drawn state beyond chance",
                "mixed": "Steps land in their drawn state beyond chance in some rows, below it in others"},
    "rl": {"supported": "RL on the transition policy raises held-out accuracy",
           "contradicted": "RL on the transition policy lowers held-out accuracy",
           NOT_SUPPORTED: "RL on the transition policy does not detectably change held-out accuracy",
           "mixed": "RL on the transition policy raises held-out accuracy in some settings and lowers it in others"},
}
WHAT = {"pass": "CTRLS against Base (Table 1)", "control": "the controllability check (do steps follow their drawn state?)",
        "rl": "RL on the transition policy (Table 2)"}


def headline(c: Claim | None, key: str) -> str:
    """The finding's headline for claim ``c`` (:data:`HEADS`), or, when it has no verdict (not run, no
    comparison, unreadable), what was not measured and why in one label."""
    if c is None:
        return f"{WHAT[key][0].upper() + WHAT[key][1:]}: not run"
    return HEADS[key].get(c.label) or f"{WHAT[key][0].upper() + WHAT[key][1:]}: {c.label}"


def _est(e) -> str:
    """"↑ +15.0 [−2.1, +30.9]" from an Estimate in points; "↑ +0.17 [+0.05, +0.29]" from one in its own unit
    (``scale`` 1, such as κ): :func:`ctrls.report.words.diff_ci`."""
    return diff_ci(e.d, e.lo, e.hi, getattr(e, "scale", 100.0), arrow=e.arrow)


def _dataset(label: str) -> str:
    return str(label).split(" ")[0].strip("`")


def _n(e, sizes: dict, key: str = "questions") -> str:
    """The estimate's n: its own (``e.n``) when the scorecard gives it, else this build's count of
    questions of its dataset (:func:`run_sizes`), else "–"."""
    n = getattr(e, "n", None)
    if n is None:
        n = sizes.get(key, {}).get(_dataset(e.label))
    return "–" if n is None else str(n)


def _mdd_words(c: Claim) -> str:
    if c.mdd is None or (isinstance(c.mdd, float) and math.isnan(c.mdd)) or c.label != NOT_SUPPORTED:
        return ""
    return say("findings", "mdd", mdd=format(c.mdd, ".0f"))


def _unmeasured(c: Claim | None, key: str) -> str | None:
    """The finding of a claim with no verdict: its headline and why, in one sentence (never a path: the
    claim's own evidence may name a file of the machine that built the book)."""
    if c is not None and c.label in HEADS[key]:
        return None
    label = "not run" if c is None else c.label
    why = say("findings", f"why.{label}" if f"why.{label}" in phrases("findings") else "why.not computed")
    return say("findings", "finding.unmeasured", head=headline(c, key), page="" if c is None else f" ({{doc}}`/{c.page}`)",
               why=why)


def pass_finding(c: Claim | None, ablation: Claim | None, sizes: dict, scaled: str = "",
                 conditioned: str = "the adapter") -> str:
    """Finding 2: CTRLS − Base pass@n (the claim), with the ``conditioned`` state alone (fixed s0: "the
    adapter" or "the state prompt", ``provenance.conditioning_name``) and the transitions beyond it,
    in one table: comparison, what it measures, questions, difference in points with its family interval."""
    missing = _unmeasured(c, "pass")
    if missing:
        return missing
    claim, run = say("findings", "pass.what.claim"), say("findings", "pass.what.run")
    rows = [(e.label + " − Base", claim, e) for e in c.estimates]
    if ablation is not None:
        alone = say("findings", "pass.what.alone", conditioned=conditioned)
        rows += [(e.label, run if e.label.startswith("development run") else alone, e) for e in ablation.beside]
        rows += [(e.label, say("findings", "pass.what.beyond", conditioned=conditioned), e) for e in ablation.estimates]
    table = [say("findings", "pass.table.head")] + ["| " + " | ".join((lab, what, _n(e, sizes), _est(e))) + " |"
                                                    for lab, what, e in rows]
    text = say("findings", "pass.text", head=headline(c, "pass"), page=c.page, label=c.label, mdd=_mdd_words(c))
    if ablation is not None and ablation.estimates:
        text += say("findings", "pass.beyond", conditioned=conditioned, label=ablation.label)
    return text + scaled + "\n\n" + "\n".join(table)


def control_finding(c: Claim | None, sizes: dict, mechanism: str = "", seeds: str = "") -> str:
    """Finding 3: the epsilon rows' estimates (the claim: κ against the independent-chain null, or,
    where the claim's estimates are in points, follows − coincidence), the fixed-s0 row beside them in a sentence, and
    ``mechanism`` (:func:`mechanism_note`), one short sentence, and ``seeds`` (:func:`seeds_note`) after the table."""
    after = "\n\n" + seeds if seeds else ""
    more = " " + mechanism if mechanism else ""
    missing = _unmeasured(c, "control")
    if missing:
        return missing + more + after
    kind = "kappa" if any(getattr(e, "scale", 100.0) == 1 for e in c.estimates) else "share"
    text = say("findings", "control.text", head=headline(c, "control"), page=c.page, label=c.label, mdd=_mdd_words(c),
               measure=say("findings", f"control.measure.{kind}"))
    for e in c.beside:
        text += say("findings", "control.beside", dataset=_dataset(e.label), n=_n(e, sizes), diff=_est(e))
    head = say("findings", f"control.head.{kind}")  # κ: a marginal interval
    table = ["| CTRLS(ε) row | questions | " + head + " |", "|---|---:|---:|"]
    table += ["| " + " | ".join((e.label.removesuffix(" κ"), _n(e, sizes), _est(e))) + " |" for e in c.estimates]
    return text + more + "\n\n" + "\n".join(table) + after


def rl_finding(c: Claim | None, sizes: dict) -> str:
    """Finding 4: held-out accuracy at the end of RL against step 0, per setting that ran."""
    missing = _unmeasured(c, "rl")
    if missing:
        return missing
    settings = [e.label.strip("`") for e in c.estimates]
    rl = sizes.get("rl", {})
    text = say("findings", "rl.text", head=headline(c, "rl"), page=c.page, ran=len(settings), label=c.label,
               settings=", ".join("`" + s + "`" for s in settings), mdd=_mdd_words(c))
    table = [say("findings", "rl.table.head")]
    for e, s in zip(c.estimates, settings):
        r = rl.get(s, {})
        runs = " × ".join((str(r["seeds"]), str(r["steps"]))) if r else "–"
        qs = " × ".join((str(r["questions"]), str(r["samples"]))) if r else "–"
        table.append("| " + " | ".join(("`" + s + "`", runs, qs, _est(e))) + " |")
    return text + "\n\n" + "\n".join(table)


def demo_findings(claims: list[Claim], sizes: dict | None = None, conditioned: str = "the adapter") -> list[str]:
    """Findings 2 to 4 from the scorecard's claims (``ctrls.report.scorecard.scorecard``); ``sizes``: this
    build's numbers of questions, seeds and steps (:func:`run_sizes`); ``conditioned``: :func:`pass_finding`'s."""
    from ctrls.report.scorecard import ABLATION_CLAIM, CONTROL_CLAIM, PASS_CLAIM, RL_CLAIM

    sizes = sizes or {}
    by = {c.claim: c for c in claims}
    from ctrls.report.scaled import claim_sentence

    return [pass_finding(by.get(PASS_CLAIM), by.get(ABLATION_CLAIM), sizes, claim_sentence(), conditioned),
            control_finding(by.get(CONTROL_CLAIM), sizes, mechanism_note(), seeds_note()),
            rl_finding(by.get(RL_CLAIM), sizes)]


def mechanism_variants(scaling: Path | None = None, injection: Path | None = None, states: Path | None = None,
                       fusion: Path | None = None) -> pd.DataFrame:
    """Every stored mechanism variant (the pretraining page's studies): one row per variant with what it
    varies, its follows rate, its coincidence reference and κ (``ctrls.report.studies.chance_corrected``).
    With no path given, the stored results; an empty frame when none is stored."""
    from ctrls.report.studies import (
        chance_corrected,
        fusion_frame,
        fusion_result_path,
        injection_frame,
        injection_result_paths,
        scaling_frame,
        scaling_result_paths,
        states_result_path,
    )

    if fusion is None and states is None:  # the stored comparison pairs with the stored sweep only
        fusion = fusion_result_path()
    scaling = scaling if scaling is not None else (scaling_result_paths() or None)
    states = states if states is not None else states_result_path()
    rows = []
    if states is not None:
        rows += [(f"K = {int(r.K)} in the K sweep", r.follows, r.coincidence) for r in scaling_frame(states).itertuples()]
    if scaling is not None:
        rows += [(f"{r.chains} training chains" + ("" if pd.isna(r.K) else f" at K = {int(r.K)}"), r.follows, r.coincidence)
                 for r in scaling_frame(scaling).itertuples()]
    for path in ([injection] if injection is not None else injection_result_paths()):
        inj = injection_frame(path)
        at_k = f" at K = {inj.attrs['K']}" if inj.attrs.get("K") else ""
        rows += [(f"the state injected at the {r['injection'].split(' (')[0]}{at_k}", r["follows"], r["coincidence"])
                 for r in inj.to_dict("records")]
    if fusion is not None and states is not None:
        fu = fusion_frame(states, fusion)
        rows += [(f"a token-dependent F_u at K = {int(r.K)}", r.follows, r.coincidence)
                 for r in fu[fu.fusion != "linear"].itertuples()]
    df = pd.DataFrame(rows, columns=["variant", "follows", "coincidence"])
    return df.assign(kappa=chance_corrected(df.follows, df.coincidence)) if len(df) else df.assign(kappa=[])


def mechanism_note(scaling: Path | None = None, injection: Path | None = None, states: Path | None = None,
                   fusion: Path | None = None) -> str:
    """Finding 3's one sentence on the stored mechanism studies (:func:`mechanism_variants`): how many
    variants, the range of κ and the variant that steers most; "" when none is stored."""
    v = mechanism_variants(scaling, injection, states, fusion)
    if v.empty:
        return ""
    return say("findings", "mechanism.note", variants=len(v), lo=_minus(format(v.kappa.min(), ".2f")),
               hi=_minus(format(v.kappa.max(), ".2f")), best=v.loc[v.kappa.idxmax()].variant)


def seeds_note(path: Path | None = None, prompts: list[Path] | None = None, option: Path | None = None,
               mask: Path | None = None) -> str:
    """Finding 3's numbers on the data seeds other than the development one: a sentence and
    ``ctrls.report.mechanism.steering_table`` (each seed named with its role); "" when none is stored."""
    from ctrls.report import mechanism

    table = mechanism.steering_table(path, prompts, option, mask)
    return say("findings", "seeds.note", table=table) if table else ""


# ---- 5. the paper's scale -----------------------------------------------------------------------


def _gpu_hours(path: Path | None) -> dict | None:
    """The measured GPU-hours of the paper profile (the first backbone × dataset), or None."""
    path = stored.result_path(GPU_RESULT.relative_to(ROOT)) if path is None else Path(path)
    if not path.is_file():
        return None
    d = stored.read(path, "gpu")  # checked: finite hours, mean <= cap, a pair to read (ctrls.report.stored)
    g = d["estimate_graph"]
    pair, h = next(iter(g["pairs_hours"].items()))
    backbone, dataset = pair.rsplit(" / ", 1)
    return {"backbone": backbone, "dataset": dataset, "mean": h["mean"], "cap": h["cap"],
            "gpu": d["environment"]["gpu"].replace("NVIDIA ", "")}


def ran_at_scale(cfg: Config) -> list[str]:
    """The paper backbones this build ran (none on the demo)."""
    return [b for b in cfg.grid.backbones if b.split("/")[-1] in PAPER_BACKBONES]


def scale_finding(cfg: Config, path: Path | None = None) -> str:
    """Finding 5: whether this build ran a paper backbone, the command that does, and the measured
    GPU-hours of one backbone × dataset (the captured decode path, judge excluded; the GPU cost page)."""
    ran = ran_at_scale(cfg)
    head = (say("findings", "scale.ran", backbones=_backbones(ran)) if ran else
            say("findings", "scale.small", backbones=", ".join("`" + b + "`" for b in cfg.grid.backbones), profile=cfg.profile))
    h = _gpu_hours(path)
    if h is None:
        return say("findings", "scale.unmeasured", head=head)
    return say("findings", "scale.measured", head=head, backbone=h["backbone"], dataset=h["dataset"],
               mean=format(h["mean"], ".1f"), cap=format(h["cap"], ".1f"), gpu=h["gpu"])


def _backbones(ran: list[str]) -> str:
    """"backbone X" or "backbones X and Y"."""
    return ("backbone " if len(ran) == 1 else "backbones ") + and_list(ran)


# ---- the verdict ----------------------------------------------------------------------------------


def _clause(c: Claim | None, key: str) -> str:
    """The verdict sentence's clause for a claim: its headline (:data:`HEADS`), or what was not measured."""
    if c is None or c.label not in HEADS[key]:
        label = "not run" if c is None else c.label
        said = say("findings", "unmeasured." + label) if "unmeasured." + label in phrases("findings") else label
        return WHAT[key] + " " + said
    h = headline(c, key)
    return h[0].lower() + h[1:] if not h.startswith(("CTRLS", "RL")) else h


def verdict_sentences(cfg: Config, claims: list[Claim], counts: dict) -> list[str]:
    """The three sentences the first page opens with: what the paper's tables can show, at what scale this
    build ran, and what it found there (the clauses of :data:`HEADS`, as in the findings' headlines)."""
    from ctrls.report.scorecard import CONTROL_CLAIM, PASS_CLAIM, RL_CLAIM

    ns = ", ".join(str(v["n"]) + " in " + name for name, v in counts["tables"].items())
    one = say("findings", "verdict.paper.none" if counts["excluding 0"] == 0 else "verdict.paper.some",
              n=counts["n"], excluding=counts["excluding 0"], ns=ns)
    ran = ran_at_scale(cfg)
    two = say("findings", "verdict.scale.ran" if ran else "verdict.scale.small", datasets=", ".join(cfg.grid.datasets),
              backbones=_backbones(ran) if ran else ", ".join(cfg.grid.backbones))
    by = {c.claim: c for c in claims}
    first, second, third = (_clause(by.get(PASS_CLAIM), "pass"), _clause(by.get(CONTROL_CLAIM), "control"),
                            _clause(by.get(RL_CLAIM), "rl"))
    res = seeds_study.pooled() if any(c.page == seeds_study.PAGE for c in claims) else None
    three = say("findings", "verdict.found.run" if res is None else "verdict.found.seeds", first=first, second=second,
                third=third, seeds=0 if res is None else len(res["seeds"]))
    return [one, two, three]


def verdict_markdown(sentences: list[str]) -> str:
    """The verdict as a box the first screen shows."""
    return say("findings", "verdict.box", sentences=" ".join(sentences)) + "\n"


# ---- the run-your-own page and the config keys ----------------------------------------------------


def pair_markdown(path: Path | None = None) -> str:
    """The paper profile's command for one backbone × dataset and its measured hours (the run-your-own page)."""
    path = stored.result_path(GPU_RESULT.relative_to(ROOT)) if path is None else Path(path)
    if not path.is_file():
        return say("findings", "pair.unmeasured") + "\n"
    d = stored.read(path, "gpu")  # checked (ctrls.report.stored)
    pairs = list(d["estimate_graph"]["pairs_hours"].items())
    many = d.get("estimate_graph_8gpu", {})
    eight = many.get("pairs_hours", {})
    backbone, dataset = pairs[0][0].rsplit(" / ", 1)
    lines = [say("findings", "pair.command", backbone=backbone, dataset=dataset, world=many.get("world_size", "several"),
                 gpu=d["environment"]["gpu"].replace("NVIDIA ", ""))]

    def hours(h: dict | None) -> str:
        return say("findings", "pair.not estimated") if h is None else "–".join(format(h[k], ".1f") for k in ("mean", "cap"))

    lines += [say("findings", "pair.row", pair=pair, one=hours(h), many=hours(eight.get(pair))) for pair, h in pairs]
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
    ("grid.n_samples", "n", "samples per question (pass@n)",
     "the paper profile's value is the paper's pass@n; fewer samples lower pass@n"),
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


def run_sizes(cfg: Config) -> dict:
    """This build's sizes, for the findings' n: ``{"questions": {dataset: test questions of the
    exploration grid}, "rl": {setting: {seeds, steps, questions, samples}}}``; a stage that has not run
    (or cannot be read) gives no entry."""
    from ctrls.stages import exploration, rl

    out: dict = {"questions": {}, "rl": {}}
    try:
        s = exploration.load_samples(cfg)
        out["questions"] = {str(k): int(v) for k, v in s.groupby("dataset").question_id.nunique().items()}
    except (FileNotFoundError, ValueError, OSError):
        pass
    try:
        c = rl.load_curves(cfg)
        ev = c[c.kind == "eval"] if "kind" in c else c
        for setting, g in ev.groupby("setting", sort=False):
            first = g.iloc[0]
            out["rl"][str(setting)] = {"seeds": int(g.seed.nunique()), "steps": int(g.step.max()),
                                       "questions": len(first.correct_by_question),
                                       "samples": int(first.samples_per_question)}
    except (FileNotFoundError, ValueError, OSError, KeyError, AttributeError):
        pass
    return out


def findings(cfg: Config, claims: list[Claim], counts: dict, gpu_result: Path | None = None,
             sizes: dict | None = None) -> list[str]:
    """The five findings, in order (module docstring)."""
    return [paper_finding(counts), *demo_findings(claims, sizes, conditioning_name(cfg)), scale_finding(cfg, gpu_result)]


def scaled_section(cfg: Config, path: Path | None = None) -> str:
    """The first page's section on the demo's task at a larger size (``ctrls.report.scaled``): the stored GPU
    run beside this build's own exploration samples (the first backbone x dataset; none when the stage has
    not run)."""
    from ctrls.report.scaled import scaled_markdown
    from ctrls.stages.exploration import load_samples

    try:
        df = load_samples(cfg)
        df = df[(df.dataset == cfg.grid.datasets[0]) & (df.trained_on == cfg.grid.datasets[0])
                & (df.backbone == cfg.grid.backbones[0])]
    except (FileNotFoundError, ValueError, KeyError, AttributeError):
        df = None
    eps = cfg.grid.epsilons[0] if cfg.grid.epsilons and cfg.grid.fixed_state else None
    return scaled_markdown(df if eps is not None else None, eps if eps is not None else 0.1, path,
                           say("findings", "scaled.this build", profile=cfg.profile, dataset=cfg.grid.datasets[0],
                               seed=cfg.data.seed, conditioned=conditioning_name(cfg)))


def forest_caption() -> str:
    return say("findings", "forest.caption", figure=FIGURE)


def findings_markdown(items: list[str], figure: str | None = None, paper_table: str = "") -> str:
    """A numbered list of the findings, with finding 1's table and the forest plot after it. Each finding's
    table (a block after a blank line) stays inside its list item."""
    def item(i: int, text: str) -> list[str]:
        first, *rest = text.split("\n")
        return [str(i) + ". " + first] + ["   " + line if line else "" for line in rest] + [""]

    out = item(1, items[0] + ("\n\n" + paper_table.rstrip("\n") if paper_table else ""))
    if figure:
        image = say("findings", "forest.image", path=figure, figure=FIGURE, width=round(100 * FOREST_WIDTH_IN))
        out += ["   " + line for line in image.split("\n")] + ["", "   " + forest_caption(), ""]
    for i, s in enumerate(items[1:], 2):
        out += item(i, s)
    return "\n".join(out)


def write_findings(cfg: Config, book: Path, claims: list[Claim] | None = None) -> Path:
    """Write ``<book>/generated/verdict.md``, ``<book>/generated/findings.md`` and the forest plot from the
    runs of ``cfg`` (the scorecard's claims, computed here when not given)."""
    import matplotlib.pyplot as plt

    from ctrls.report import paper_power
    from ctrls.report.scorecard import paper_power_counts, scorecard

    out = Path(book) / "generated"
    out.mkdir(parents=True, exist_ok=True)
    claims = scorecard(cfg) if claims is None else claims
    pw = paper_power.paired_p_columns(paper_power.paper_power())
    fig = paper_forest(pw)
    fig.savefig(out / FOREST, dpi=100)
    plt.close(fig)
    counts = paper_power_counts(pw)
    (out / "verdict.md").write_text(verdict_markdown(verdict_sentences(cfg, claims, counts)))
    path = out / "findings.md"
    path.write_text(findings_markdown(findings(cfg, claims, counts, sizes=run_sizes(cfg)), f"/generated/{FOREST}",
                                      paper_table_markdown(pw)))
    (out / "scaled.md").write_text(scaled_section(cfg))
    (out / "paper_pair.md").write_text(pair_markdown())  # the run-your-own page's
    (out / "config_keys.md").write_text(config_keys_markdown())
    (out / "gpu_provenance.md").write_text(gpu_provenance_markdown())  # the GPU cost page's
    return path


GPU_RESULTS = {  # the GPU cost page's stored results, and what each holds
    "bench/results/gpu_estimate_measured_nvidia_h200_qwen.json": "hours measured with CUDA graphs",
    "bench/results/graph_check_h100.json": "the captured path checked against the engine",
    "bench/results/gpu_estimate_analytic.json": "the analytic estimate",
    "bench/results/gpu_estimate_measured_nvidia_h100_80gb_hbm3.json": "hours measured with the eager engine",
}


def gpu_provenance_markdown() -> str:
    """The GPU cost page's provenance note: each stored GPU result with the device it ran on."""
    from ctrls.report.provenance import stored_note

    return stored_note(GPU_RESULTS, intro="The GPU numbers were measured once, on the devices below, and stored; "
                                          "the book reads them and does not rerun them.")


__all__ = ["HEADS", "config_keys_markdown", "gpu_provenance_markdown", "demo_findings", "findings", "findings_markdown",
           "headline", "mechanism_note", "mechanism_variants", "pair_markdown", "paper_finding", "paper_forest",
           "paper_table_markdown", "paper_tables", "run_sizes", "scale_finding", "scaled_section", "verdict_markdown",
           "verdict_sentences", "write_findings"]
