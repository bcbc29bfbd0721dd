"""The claims scorecard of the book's first page: for each of the paper's claims, the evidence this
run has, the verdict with its interval (``ctrls.report.verdicts``), and the page that shows it. Reads the
artifacts of the other stages, only those of this config (``ctrls.stages.common.current_outputs``),
and names each claim's state, never guessed: "not run" (its stage has not run for this config),
"no comparison in this profile" (the grid has nothing to compare) or "unreadable: <file>" (results
that cannot be read or hold NaN).

``ctrls reproduce`` writes it to ``<book>/generated/scorecard.md`` after the notebooks, and the intro
page includes that file.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ctrls.config.schema import Config
from ctrls.config.settings import FIXED
from ctrls.report import paper_power, tables
from ctrls.report.display import and_list
from ctrls.report.provenance import git_commit
from ctrls.report.stored import read as read_stored
from ctrls.report.stored import result_path
from ctrls.report.verdicts import (
    NOT_SUPPORTED,
    OWN,
    Claim,
    Estimate,
    claim_verdict,
    pct,
    pts,
    rl_verdicts,
    scorecard_markdown,
)
from ctrls.report.words import say
from ctrls.stages import exploration, rl
from ctrls.stages import synthetic as study
from ctrls.stages.common import NotRunError, UnreadableResultsError
from ctrls.stats import power
from ctrls.synthetic import chain as synthetic

PILOT_RESULT = "studies/results/word_problems_difficulty.json"
PILOT = Path(__file__).resolve().parents[2] / PILOT_RESULT  # the repository's
NOT_RUN = "not run"  # the stage has not run for this config
NO_COMPARISON = "no comparison in this profile"  # the profile's grid has nothing to compare
UNREADABLE = "unreadable"  # "unreadable: <file>": results on disk that cannot be read or hold NaN


def pilot(cfg: Config, path: Path | None = None) -> dict | None:
    """The pilot measurement (studies/word_problems.py) at the profile's difficulty, or None when the
    profile's dataset is not ``word_problems`` or the pilot did not measure that difficulty. ``path``: the
    stored pilot under ``$CTRLS_RESULTS_DIR``, else the repository's (``ctrls.report.stored``, which checks it)."""
    path = Path(path) if path is not None else result_path(PILOT_RESULT)
    if cfg.data.dataset != "word_problems" or not path.is_file():
        return None
    tag = cfg.data.word_problems.difficulty().tag()
    d = read_stored(path, "pilot")
    return next((r for r in d["levels"] if r["difficulty"] == tag), None)


def _kind(verdict: str) -> str:
    """'supported', 'contradicted' or 'not supported' (the one label for an unresolved estimate)."""
    return verdict if verdict in ("supported", "contradicted") else NOT_SUPPORTED


def _combine(verdicts: list[str]) -> str:
    """One verdict for a claim tested on several rows (a Holm family): supported when some row
    supports it and none contradicts it, and so on; "mixed" when rows go both ways. Rows none of
    which is resolved give *not supported* with their directions: the row's own sentence for one
    row, else how many estimates lie in the claimed direction."""
    if not verdicts:  # nothing was compared: never "every estimate is ..." of no estimates
        return "not computed"
    kinds = [_kind(v) for v in verdicts]
    s, c = "supported" in kinds, "contradicted" in kinds
    if s and c:
        return "mixed"
    if s or c:
        return "supported" if s else "contradicted"
    if len(verdicts) == 1:
        return verdicts[0]
    up = sum("in the claimed direction" in v for v in verdicts)
    down = sum("in the opposite direction" in v for v in verdicts)
    zero = len(verdicts) - up - down
    for k, where in ((down, "in the opposite direction"), (up, "in the claimed direction"), (zero, "zero")):
        if k == len(verdicts):
            return say("scorecard", "combine.all", label=NOT_SUPPORTED, where=where)
    return say("scorecard", "combine.split", label=NOT_SUPPORTED, up=up, n=len(verdicts), down=down,
               zero=say("scorecard", "combine.zero", zero=zero) if zero else "")


def _mdd_note(mdd: dict, key: str, verdict: str = NOT_SUPPORTED) -> str:
    """The demo's minimal detectable difference beside an unresolved verdict ("" otherwise)."""
    v = mdd.get(key)
    if _kind(verdict) != NOT_SUPPORTED or v is None or math.isnan(v):
        return ""
    return say("scorecard", "mdd", mdd=format(v, ".0f"))


def controllability_claim(ct: pd.DataFrame, mdd: dict, page: str) -> Claim | None:
    """Eq. 8's row from ``tables.controllability_table``: judged on the epsilon rows' kappa against the
    independent-chain null (the row's own read-back against a second chain drawn by the same policy from
    the same s_0: the no-steering null, ``ctrls.stats.agreement``), Holm over the epsilon rows; the
    fixed-s0 row (the conditioning holding one state) is reported beside it and does not enter the verdict.
    None when no row has a kappa."""
    eps = ct[ct["κ"].notna()] if "κ" in ct else ct.iloc[:0]
    fixed = ct[(ct.config == FIXED) & ct["Δ vs Base"].notna()] if "Δ vs Base" in ct else ct.iloc[:0]
    if eps.empty:
        return None
    ev = "; ".join(f"{r.dataset} {r.config}: {100 * r.follows:.1f}% of {int(r.steps)} steps land in their drawn state vs "
                   f"{100 * r['null']:.1f}% in an independent chain's, κ {r['κ']:.2f} [{r['κ lo']:.2f}, {r['κ hi']:.2f}] "
                   f"({int(r.questions)} questions)" for _, r in eps.iterrows())
    v = _combine([claim_verdict(r["κ"], r["p (κ, Holm)"], lo=r["κ lo"], hi=r["κ hi"], scale=1.0, unit="")
                  for _, r in eps.iterrows()])
    est = [Estimate(f"{r.dataset} {r.config} κ", r["κ"], r["κ lo"], r["κ hi"], scale=1.0, unit="") for _, r in eps.iterrows()]
    return Claim(CONTROL_CLAIM, "Eq. 8",
                 "ε rows, steps that land in their drawn state against the independent-chain null: " + ev,
                 v, page, block=OWN, claimed=CONTROL_DIR, estimates=est, mdd=mdd.get("controllability"),
                 beside=[Estimate(f"{r.dataset} fixed s0 − Base steps in s0", r["Δ vs Base"], r["Δ lo"], r["Δ hi"])
                         for _, r in fixed.iterrows()])


def _load(load, cfg: Config):
    """(results, None) from ``load(cfg)``, or (None, (verdict, evidence)) naming why there are none:
    "not run" (the stage has not run, or not for this config: the reason is the evidence) or
    "unreadable: <file>" (results on disk that cannot be read or hold NaN)."""
    try:
        return load(cfg), None
    except UnreadableResultsError as e:
        return None, (f"{UNREADABLE}: {e.path}", str(e))
    except FileNotFoundError as e:
        return None, (NOT_RUN, str(e) if isinstance(e, NotRunError) else "")


def _exploration_gaps(cfg: Config) -> dict[str, str]:
    """The exploration claims this profile's grid cannot test, with why (its rows have no comparison)."""
    g, why = cfg.grid, {}
    if not g.epsilons:
        why["eps"] = ("the grid has no CTRLS(ε) row (grid.epsilons is empty)" +
                      ("" if g.fixed_state else " and no fixed-s0 row (grid.fixed_state is false): Base only"))
    if not (g.epsilons and g.fixed_state):
        why["ablation"] = "the ablation compares CTRLS(ε) rows with the fixed-s0 row: " + (
            "grid.fixed_state is false" if g.epsilons else why["eps"])
    return why


PASS_CLAIM = "ε-greedy state transitions raise pass@n over Base"
ABLATION_CLAIM = "the gain comes from the state transitions, not from conditioning on s0 alone"
CONTROL_CLAIM = "generation follows the sampled latent state"
RL_CLAIM = "RL on the transition policy raises accuracy"
PASS_DIR = "↑ CTRLS(ε) − Base, pass@n"
ABLATION_DIR = "↑ CTRLS(ε) − fixed s0, pass@n"
CONTROL_DIR = "↑ κ of steps in their drawn state against the independent-chain null"
RL_DIR = "↑ end − step 0, held-out accuracy"


def demo_claims(cfg: Config, mdd: dict | None = None) -> list[Claim]:
    """The scorecard rows from this run's exploration and RL stages. A row states "not run" when its
    stage has not run for this config, "no comparison in this profile" when the profile's grid has
    nothing to compare (e.g. ``grid.epsilons=[]``), and "unreadable: <file>" when its results cannot
    be read or hold NaN."""
    mdd = mdd or {}
    out: list[Claim] = []
    page1 = "generated/02_exploration"
    gaps = _exploration_gaps(cfg)
    samples, missing = (None, None) if "eps" in gaps else _load(exploration.load_samples, cfg)
    if "eps" in gaps:
        out += [Claim(PASS_CLAIM, "Table 1", gaps["eps"], NO_COMPARISON, page1, claimed=PASS_DIR),
                Claim(ABLATION_CLAIM, "Sec. 6.2; our fixed-s0 ablation", gaps["ablation"], NO_COMPARISON, page1,
                      block=OWN, claimed=ABLATION_DIR),
                Claim(CONTROL_CLAIM, "Eq. 8", gaps["eps"], NO_COMPARISON, page1, block=OWN, claimed=CONTROL_DIR)]
    elif samples is None:
        out.append(Claim(PASS_CLAIM, "Table 1", missing[1], missing[0], page1, claimed=PASS_DIR))
    else:
        t1 = tables.table1(samples, seed=cfg.seed)
        rows = t1[t1.p.notna() & ~t1.config.isin(["fixed s0"])]
        ev = "; ".join(f"{r.dataset} {r.config} (η={r.temperature:g}): {pts(r['Δ pass@n vs Base'], r['Δ lo'], r['Δ hi'])}"
                       for _, r in rows.iterrows())
        v = _combine([claim_verdict(r["Δ pass@n vs Base"], r["p (Holm)"], lo=r["Δ lo"], hi=r["Δ hi"])
                      for _, r in rows.iterrows()])
        out.append(Claim(PASS_CLAIM, "Table 1, Sec. 6.2",
                         f"pass@{int(t1.samples.max())} vs Base "
                         f"({', '.join(f'{d}: {n} questions' for d, n in t1.groupby('dataset').questions.max().items())}): "
                         f"{ev}",
                         v + _mdd_note(mdd, "pass@n", v), page1, claimed=PASS_DIR, mdd=mdd.get("pass@n"),
                         estimates=[Estimate(f"{r.dataset} {r.config} (η={r.temperature:g})", r["Δ pass@n vs Base"],
                                             r["Δ lo"], r["Δ hi"]) for _, r in rows.iterrows()]))
        ab_all = tables.ablation_table(samples, seed=cfg.seed)
        ab = ab_all[ab_all.comparison.str.endswith("− fixed s0")] if not ab_all.empty else ab_all
        alone = ab_all[ab_all.comparison.str.startswith("fixed s0 −")] if not ab_all.empty else ab_all
        if "ablation" in gaps:
            out.append(Claim(ABLATION_CLAIM, "Sec. 6.2; our fixed-s0 ablation", gaps["ablation"], NO_COMPARISON, page1,
                             block=OWN, claimed=ABLATION_DIR))
        elif not ab.empty:
            ev = "; ".join(f"{r.dataset} {r.comparison} (η={r.temperature:g}): "
                           f"{pts(r['Δ pass@n'], r['Δ pass@n lo'], r['Δ pass@n hi'])}"
                           for _, r in ab.iterrows())
            v = _combine([claim_verdict(r["Δ pass@n"], r["p (pass@n, Holm)"], lo=r["Δ pass@n lo"], hi=r["Δ pass@n hi"])
                          for _, r in ab.iterrows()])
            est = lambda t: [Estimate(f"{r.dataset} {r.comparison} (η={r.temperature:g})", r["Δ pass@n"],  # noqa: E731
                                      r["Δ pass@n lo"], r["Δ pass@n hi"]) for _, r in t.iterrows()]
            out.append(Claim(ABLATION_CLAIM, "Sec. 6.2; our fixed-s0 ablation", f"pass@n: {ev}",
                             v + _mdd_note(mdd, "ablation", v), page1, block=OWN, claimed=ABLATION_DIR,
                             estimates=est(ab), mdd=mdd.get("ablation"), beside=est(alone)))
        claim = controllability_claim(tables.controllability_table(samples, seed=cfg.seed), mdd, page1)
        if claim is not None:
            out.append(claim)
    page3 = "generated/03_rl"
    curves, missing = _load(rl.load_curves, cfg)
    try:
        rv = None if curves is None else rl_verdicts(curves)
    except ValueError as e:  # curves without per-question results: refused with their reason
        rv, missing = None, (NOT_RUN, str(e))
    if rv is None:
        out.append(Claim(RL_CLAIM, "Alg. 2, Table 2", missing[1], missing[0], page3, claimed=RL_DIR))
    elif rv.empty:
        out.append(Claim(RL_CLAIM, "Alg. 2, Table 2", "no RL run has an evaluation after step 0 to compare with "
                         "step 0 (rl.steps, rl.eval_every)", NO_COMPARISON, page3, claimed=RL_DIR))
    else:
        ev = "; ".join(f"`{r.setting}` ({r.seeds} seeds × {r['last step']} steps): {pts(r['Δ'], r['Δ lo'], r['Δ hi'])}"
                       for _, r in rv.iterrows())
        verdicts = [claim_verdict(r["Δ"], r["p (Holm)"], lo=r["Δ lo"], hi=r["Δ hi"]) for _, r in rv.iterrows()]
        v = _combine(verdicts)
        out.append(Claim(RL_CLAIM, "Alg. 2, Table 2",
                         f"held-out accuracy, end vs step 0: {ev}", v + _mdd_note(mdd, "rl", v),
                         page3, claimed=RL_DIR, mdd=mdd.get("rl"),
                         estimates=[Estimate(f"`{r.setting}`", r["Δ"], r["Δ lo"], r["Δ hi"]) for _, r in rv.iterrows()]))
    return out


def synthetic_claims(cfg: Config) -> list[Claim]:
    page = "generated/07_synthetic"
    both, missing = _load(lambda c: (study.load_curves(c), study.load_recovery(c)), cfg)
    if both is None:
        return [Claim("the synthetic study's claims", "App. C.1, Sec. 6.3", missing[1], missing[0], page, block=OWN)]
    curves, recovery = both
    c = synthetic.claims(synthetic.run_summary(curves), recovery, cfg)
    return [Claim(r.claim, f"synthetic; {r.paper}",
                  f"{r.measure}: {'not computed' if pd.isna(r.value) else format(r.value, 'g')}, 95% CI {r['95% CI']}"
                  + (f", family interval {r['family CI']}" if "family CI" in r else ""),
                  r.verdict, page, block=OWN, claimed=r.claimed,
                  estimates=[Estimate("", r.value, *_interval(r.get("family CI", r["95% CI"])), scale=1, unit="")])
            for _, r in c.iterrows()]


def _interval(text: str) -> tuple[float, float]:
    """(lo, hi) of an interval written "[lo, hi]" (``synthetic.claims``'s columns)."""
    lo, hi = (float(x) for x in text.strip("[] ").split(","))
    return lo, hi


def paper_power_counts(pw: pd.DataFrame | None = None) -> dict:
    """What the paper's own Tables 1 and 2 show (``ctrls.stats.power``): how many CTRLS − Base differences
    there are, how many point up, down or nowhere, how many have an interval that excludes 0 and how
    many lie below their minimal detectable difference, and per table how many an exact McNemar test
    could resolve under the most and the least favourable pairing of the questions."""
    pw = paper_power.paired_p_columns(paper_power.paper_power()) if pw is None else pw
    d = pw["diff (pp)"]
    out = {"n": len(pw), "up": int((d > 0).sum()), "down": int((d < 0).sum()), "zero": int((d == 0).sum()),
           "excluding 0": int(pw["excludes 0"].sum()), "below MDD": int(pw["below MDD"].sum()),
           "largest": float(d.loc[d.abs().idxmax()]), "tables": {}}  # the largest in size, signed
    for table, g in pw.groupby("table", sort=False):
        out["tables"][table] = {"n": int(g.n.iloc[0]), "differences": len(g),
                                "best": int((g["p, minimal discordance"] < power.ALPHA).sum()),
                                "worst": int((g["p, maximal discordance"] < power.ALPHA).sum()),
                                "median MDD up": float(g["MDD up (pp)"].median())}
    return out


def paper_power_claim() -> Claim:
    """The paper's own tables, by table (:func:`paper_power_counts`): Table 1 cannot resolve any
    difference under any pairing of its 40 questions; for Table 2 the published rates leave a range
    open, stated."""
    c = paper_power_counts()
    parts = [f"{t}: none resolvable" if v["best"] == 0 else f"{t}: undecided ({v['worst']}–{v['best']} of {v['differences']})"
             for t, v in c["tables"].items()]
    return Claim("the paper's CTRLS-vs-Base differences are real", "Tables 1 and 2",
                 f"{c['n']} differences: {c['up']} ↑, {c['down']} ↓, {c['zero']} =; {c['excluding 0']} with a 95% "
                 f"interval that excludes 0, {c['below MDD']} below their minimal detectable difference",
                 "; ".join(parts), "generated/06_summary", claimed="↑ CTRLS − Base")


N_SIM = 1000  # simulated runs of every power figure: the summary page and the scorecard quote the same numbers


def design_inputs(cfg: Config) -> dict | None:
    """What the demo's power calculation starts from: the pilot's Base pass@1, Succ. and their own
    intra-question correlations; the between-arm correlation ``rho`` (the pilot's, where it measured
    two arms; else estimated from this run's Base and CTRLS per-question rates,
    ``ctrls.stats.sizing.between_arm_correlation``; else 1, the deterministic shift, stated); the
    controllability reference (the rate at which Base steps land in chains drawn for them, from this
    run; else chance 1/K, stated). None without a pilot."""
    from ctrls.stats.sizing import between_arm_correlation

    p = pilot(cfg)
    if p is None:
        return None
    out = {"p0": p["pass@1"], "icc": p["icc"], "succ0": p.get("succ"), "icc_succ": p.get("icc (succ)"),
           "rho": p.get("rho"), "rho from": "the pilot" if p.get("rho") is not None else None,
           "reference": None, "reference from": f"chance 1/K = 1/{cfg.states.n_states} (no run to measure it)"}
    samples, _ = _load(exploration.load_samples, cfg)
    if samples is not None and out["rho"] is None:
        rs = []
        for _, g in samples[samples.dataset == cfg.data.dataset].groupby(["backbone", "temperature"]):
            rates = g.groupby(["config", "question_id"]).correct.mean().unstack(0)
            if "Base" in rates:
                rs += [between_arm_correlation(rates["Base"], rates[c]) for c in rates if c not in ("Base", "fixed s0")
                       and rates[c].notna().all() and rates["Base"].notna().all() and len(rates) >= 3]
        if rs:
            pairs = f"{len(rs)} pair{'s' if len(rs) != 1 else ''}"
            out["rho"], out["rho from"] = float(np.mean(rs)), f"this run's Base and CTRLS rows ({pairs})"
    if samples is not None:
        try:
            ct = tables.controllability_table(samples, n_boot=10, seed=cfg.seed)
            ref = ct[ct.config != "fixed s0"]["Base, random states"].dropna() if "Base, random states" in ct else []
            if len(ref):
                out["reference"] = float(ref.mean())
                out["reference from"] = "this run's Base steps paired with drawn chains (ε rows)"
        except (ValueError, KeyError):
            pass
    if out["rho"] is None:
        out["rho"], out["rho from"] = 1.0, "none measured: 1, the deterministic shift (optimistic)"
    return out


def power_note(cfg: Config) -> str:
    """What the power table below starts from: the pilot's numbers, or why there is none."""
    p, d = pilot(cfg), design_inputs(cfg)
    if p is None:
        return say("scorecard", "power.no pilot", dataset=cfg.data.dataset)
    lo, hi = p["pass@1 95% CI"]
    icc_succ = d["icc_succ"] if d["icc_succ"] is not None else p["icc"]
    return say("scorecard", "power.note", difficulty=p["difficulty"], questions=p["questions"], samples=p["samples"],
               pass1=pct(p["pass@1"], lo, hi), succ=pct(p["succ"]), icc=format(p["icc"], ".2f"),
               icc_succ=format(icc_succ, ".2f"), rho=format(d["rho"], ".2f"), rho_from=d["rho from"],
               reference="" if d["reference"] is None else pct(d["reference"]) + " ", reference_from=d["reference from"],
               sims=format(N_SIM, ","), n=cfg.grid.n_samples)


def _demo_power(cfg: Config) -> pd.DataFrame:
    from ctrls.stats.sizing import demo_power

    d = design_inputs(cfg)
    if d is None:
        return pd.DataFrame()
    return demo_power(cfg, d["p0"], d["icc"], succ0=d["succ0"], icc_succ=d["icc_succ"], rho=d["rho"],
                      reference=d["reference"], n_sim=N_SIM)


def demo_power_table(cfg: Config) -> pd.DataFrame:
    """``ctrls.stats.sizing.demo_power`` from the pilot at the profile's sizes (empty without a pilot)."""
    t = _demo_power(cfg)
    if t.empty:
        return t
    return t.drop(columns="key").round({"base rate (%)": 1, "power at +10 pts": 2, "MDD at 80% power (pts)": 0})


def demo_mdds(cfg: Config) -> dict:
    """The demo's MDDs (points, rounded as the summary page prints them) keyed as ``demo_claims``
    reads them; {} without a pilot."""
    t = _demo_power(cfg)
    return {} if t.empty else dict(zip(t.key, t["MDD at 80% power (pts)"].round(0)))


def scorecard(cfg: Config) -> list[Claim]:
    """The first page's claims: the method's rows decided over the seeds study's training runs where it is stored
    (``ctrls.report.seeds_study``; this build's run beside them), then the synthetic study's and the paper's power."""
    from ctrls.report import seeds_study

    method = seeds_study.method_claims(demo_claims(cfg, demo_mdds(cfg)), seeds_study.pooled(),
                                       {PASS_CLAIM: "pass", ABLATION_CLAIM: "ablation", CONTROL_CLAIM: "control", RL_CLAIM: "rl"})
    return [*method, *synthetic_claims(cfg), paper_power_claim()]


def write_scorecard(cfg: Config, path: Path, claims: list[Claim] | None = None) -> Path:
    """Write the scorecard Markdown (with the run it comes from) to ``path``: ``claims``, or the
    scorecard of ``cfg``'s runs."""
    bb, ds = cfg.grid.backbones, cfg.grid.datasets
    commit = git_commit()
    where = (f"Generated from the `{cfg.profile}` profile's runs: backbone{'s' if len(bb) != 1 else ''} {and_list(bb)}, "
             f"dataset{'s' if len(ds) != 1 else ''} {and_list(ds)}"
             + (f", commit `{commit}`" if commit != "unknown" else "") + ". Verdicts are read off Holm-adjusted "
             "p-values at 0.05 over each page's family, together with the family interval beside them (Newcombe's, "
             "Bonferroni over the family: simultaneous 95%). *Not supported* means the test and the interval do not "
             "resolve the difference at this size; the estimate's direction is stated. It is not evidence of no effect.")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(scorecard_markdown(scorecard(cfg) if claims is None else claims, where))
    return path


__all__ = ["demo_claims", "demo_power_table", "paper_power_counts", "pilot", "power_note", "scorecard", "synthetic_claims",
           "write_scorecard"]
