"""The seeds study on the page: frames, figures and scorecard rows read from ``studies/results/seeds_pooled.json``
(written by ``studies/seeds_study.py pool``; the validating reader is ``ctrls.report.stored``, kind
``seeds_pooled``). The claims over training runs, each with its pooled estimate, HKSJ 95% interval, the
between-run spread tau, I^2 and the 95% prediction interval for one new run; each seed's constant-state pass@1;
RL's end policy against the best constant state. The page's words are in ``notebooks/08_seeds.ipynb``.
"""
from __future__ import annotations

import math

import pandas as pd

from ctrls.report.stored import read, stored_result
from ctrls.report.verdicts import NOT_SUPPORTED, Claim, Estimate, claim_verdict, pts

POOLED_RESULT = "studies/results/seeds_pooled.json"
PAGE = "generated/08_seeds"
# claim -> (what it measures, the paper's claim it tests); the order of the page's tables and figure
MEANING = {
    "eps_minus_base_pass_n": ("CTRLS(ε) − Base, pass@n", "Table 1: CTRLS raises pass@n"),
    "hold_s0_minus_base_pass1": ("hold s₀ − Base, pass@1", "the state alone, no transitions"),
    "eps_minus_hold_s0_pass1": ("CTRLS(ε) − hold s₀, pass@1", "the transitions beyond the state"),
    "eps_minus_hold_s0_pass_n": ("CTRLS(ε) − hold s₀, pass@n", "the transitions beyond the state"),
    "rl_minus_pretrained_pass1": ("RL end policy − pretrained CTRLS(ε), pass@1", "Table 2: RL raises accuracy"),
    "rl_minus_best_constant_pass1": ("RL end policy − best constant state, pass@1", "RL finds the best policy it can express"),
    "kappa": ("κ against the independent-chain null", "Eq. 8: the state steers the step"),
}


def pooled(root=None) -> dict | None:
    """The stored pooled result, checked (``StoredResultError`` naming the file and field), or None when absent."""
    p = stored_result(POOLED_RESULT, root)
    return None if p is None else read(p, "seeds_pooled")


def _p(r: dict) -> float:
    """Two-sided p of the HKSJ t statistic (k - 1 degrees of freedom), from the stored standard error (an
    interval cut to [-1, 1] does not carry it)."""
    from scipy import stats as st

    return 1.0 if r["se"] == 0 else float(2 * st.t.sf(abs(r["estimate"]) / r["se"], r["n_seeds"] - 1))


def claims_frame(res: dict) -> pd.DataFrame:
    """One row per claim: what it measures, seeds, pooled estimate [HKSJ 95% CI], the prediction interval for one
    new run, tau, I^2 and Q (differences in points, kappa as itself), and the seed-then-question bootstrap."""
    rows = []
    for key, (what, tests) in MEANING.items():
        r = res["claims"][key]
        k = r["unit"] == "kappa"
        f = (lambda x: f"{x:+.2f}".replace("-", "−")) if k else (lambda x: f"{100 * x:+.1f}".replace("-", "−"))
        b = r.get("bootstrap")
        rows.append({"claim": what, "tests": tests, "seeds": r["n_seeds"],
                     "pooled [95% CI]": f"{f(r['estimate'])} [{f(r['lo'])}, {f(r['hi'])}]",
                     "one new run, 95% PI": "–" if r["pred_lo"] is None else f"[{f(r['pred_lo'])}, {f(r['pred_hi'])}]",
                     "τ": (f"{r['tau']:.2f}" if k else f"{100 * r['tau']:.1f}"), "I²": f"{100 * r['i2']:.0f}%",
                     "Q": f"{r['q']:.1f}",
                     "bootstrap [95%]": "–" if b is None else f"{f(b['estimate'])} [{f(b['lo'])}, {f(b['hi'])}]"})
    return pd.DataFrame(rows)


def per_seed_frame(res: dict) -> pd.DataFrame:
    """Every seed's estimate of every claim (points; kappa as itself), seeds as rows."""
    out = {}
    for key, (what, _) in MEANING.items():
        r = res["claims"][key]
        s = 1 if r["unit"] == "kappa" else 100
        out[what] = {x["data_seed"]: round(s * x["estimate"], 2 if s == 1 else 1) for x in r["per_seed"]}
    return pd.DataFrame(out).rename_axis("data seed").reset_index()


def states_frame(res: dict) -> pd.DataFrame:
    """Per seed and state: its constant-state pass@1 on all test questions, the share of questions whose s_0 it is,
    the kinds of Base's steps read back as it, and whether it was the best on the validation half."""
    rows = []
    for s in res["states"]:
        base = s["pass1"].get("Base", math.nan)
        for j, p in s["constant_pass1"].items():
            kinds = s.get("step_kinds", {}).get(j, {})
            rows.append({"data seed": s["data_seed"], "state": int(j), "pass@1 (%)": round(100 * p, 1),
                         "− Base (points)": round(100 * (p - base), 1), "s₀ share (%)": round(100 * s["s0_share"][j]),
                         "chosen on validation": "yes" if int(j) == s["best_constant"] else "",
                         **{f"{k} (%)": round(100 * v) for k, v in kinds.items()}})
    return pd.DataFrame(rows)


def numbers(res: dict) -> dict[str, str]:
    """The page's glued numbers, each formatted once: ``<claim>`` (estimate [CI] in points, or kappa), and
    ``<claim>_pi`` (the prediction interval), ``<claim>_tau``, ``<claim>_i2``; ``n_seeds``, ``seeds``, the RL power."""
    out = {"n_seeds": str(len(res["seeds"])), "seeds": ", ".join(str(s) for s in res["seeds"])}
    for key, r in res["claims"].items():
        if r["unit"] == "kappa":
            f = lambda x: f"{x:.2f}".replace("-", "−")  # noqa: E731
            out[key] = f"{f(r['estimate'])} [{f(r['lo'])}, {f(r['hi'])}]"
            out[f"{key}_tau"] = f"{r['tau']:.2f}"
        else:
            out[key] = pts(r["estimate"], r["lo"], r["hi"])
            f = lambda x: f"{100 * x:+.1f}".replace("-", "−")  # noqa: E731
            out[f"{key}_tau"] = f"{100 * r['tau']:.1f}"
        out[f"{key}_pi"] = "–" if r["pred_lo"] is None else f"[{f(r['pred_lo'])}, {f(r['pred_hi'])}]"
        out[f"{key}_i2"] = f"{100 * r['i2']:.0f}%"
    pw = res["rl_power"]
    out["rl_power"] = f"{pw['power']:.2f}"
    out["rl_power_delta"] = f"{100 * pw['delta']:.0f}"
    out["rl_seeds_for_80"] = "more than 128" if pw.get("seeds_for_80") is None else str(pw["seeds_for_80"])
    return out


def forest(res: dict):
    """One panel per claim: each seed's estimate with its 95% interval (±1.96 SE over its questions), the pooled
    estimate with its HKSJ interval (black) and the prediction interval for one new run (grey band)."""
    import matplotlib.pyplot as plt

    keys = list(MEANING)
    fig, axes = plt.subplots(len(keys), 1, figsize=(6.4, 1.0 + 1.05 * len(keys)), sharex=False)
    for ax, key in zip(axes, keys):
        r = res["claims"][key]
        s = 1 if r["unit"] == "kappa" else 100
        per = r["per_seed"]
        ys = list(range(len(per), 0, -1))
        for y, x in zip(ys, per):
            ax.errorbar(s * x["estimate"], y, xerr=s * 1.96 * x["se"], fmt="o", color="#1f77b4", ms=4, capsize=2)
        if r["pred_lo"] is not None:
            ax.axvspan(s * r["pred_lo"], s * r["pred_hi"], color="0.85", zorder=0)
        ax.errorbar(s * r["estimate"], 0, xerr=[[s * (r["estimate"] - r["lo"])], [s * (r["hi"] - r["estimate"])]],
                    fmt="D", color="black", ms=6, capsize=3)
        ax.axvline(0, color="0.4", lw=0.8, ls="--")
        ax.set_yticks([0, *ys], ["pooled", *[str(x["data_seed"]) for x in per]], fontsize=7)
        ax.set_title(MEANING[key][0] + (" (κ)" if s == 1 else " (points)"), fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return fig


def lottery(res: dict):
    """Per seed: each state's constant-state pass@1 minus Base (dots, sized by how often s_0 falls in that state)
    and hold s_0 − Base (a cross): whether which state s_0 falls in explains what holding it does."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    hold = {x["data_seed"]: x["estimate"] for x in res["claims"]["hold_s0_minus_base_pass1"]["per_seed"]}
    for i, s in enumerate(res["states"]):
        base = s["pass1"]["Base"]
        for j, p in s["constant_pass1"].items():
            share = s["s0_share"][j]
            ax.scatter(i, 100 * (p - base), s=20 + 200 * share, color=f"C{int(j) - 1}", alpha=0.7,
                       label=f"state {j}" if i == 0 else None)
        ax.scatter(i, 100 * hold[s["data_seed"]], marker="x", color="black", s=50, label="hold s₀" if i == 0 else None)
    ax.axhline(0, color="0.4", lw=0.8, ls="--")
    ax.set_xticks(range(len(res["states"])), [str(s["data_seed"]) for s in res["states"]], fontsize=8)
    ax.set_xlabel("data seed (one training run)", fontsize=9)
    ax.set_ylabel("pass@1 − Base (points)", fontsize=9)
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    fig.tight_layout()
    return fig


# the scorecard's method rows: claim key of ctrls.report.scorecard -> the pooled claims its verdict is read from
KAPPA = {"scale": 1, "unit": ""}  # kappa is shown as itself, not in points
BESIDE = {"ablation": ("hold_s0_minus_base_pass1",)}  # pooled claims a row shows beside its verdict's (the state alone)
SCORECARD = {"pass": ("eps_minus_base_pass_n",), "ablation": ("eps_minus_hold_s0_pass_n", "eps_minus_hold_s0_pass1"),
             "control": ("kappa",), "rl": ("rl_minus_pretrained_pass1", "rl_minus_best_constant_pass1")}


def pooled_verdict(res: dict, keys: tuple[str, ...]) -> tuple[str, list[Estimate]]:
    """The verdict over seeds for the pooled claims ``keys`` (Holm over them, each with its HKSJ interval), and
    their Estimates (kappa in its own unit)."""
    from ctrls.stats.metrics import holm

    rs = [res["claims"][k] for k in keys]
    ps = holm([_p(r) for r in rs])
    verdicts = [claim_verdict(r["estimate"], p, lo=r["lo"], hi=r["hi"], **KAPPA if r["unit"] == "kappa" else {})
                for r, p in zip(rs, ps)]
    labels = {v.split(":")[0] for v in verdicts}
    verdict = verdicts[0] if len(labels) == 1 else ("mixed" if {"supported", "contradicted"} <= labels else NOT_SUPPORTED)
    ests = [Estimate(f"{MEANING[k][0]} over {r['n_seeds']} seeds", r["estimate"], r["lo"], r["hi"],
                     **KAPPA if r["unit"] == "kappa" else {}) for k, r in zip(keys, rs)]
    for e, r in zip(ests, rs):
        e.n = f"{r['n_seeds']} runs"  # the findings' n column: runs, not questions
    return verdict, ests


def method_claims(claims: list[Claim], res: dict | None, key_of: dict[str, str]) -> list[Claim]:
    """The scorecard's method rows decided over training runs: each of ``claims`` whose claim ``key_of`` maps to a
    key of :data:`SCORECARD` takes the pooled verdict and estimates, and keeps this build's own estimates beside
    them (one run: the development seed). Without a stored study, ``claims`` unchanged."""
    if res is None:
        return claims
    out = []
    for c in claims:
        k = key_of.get(c.claim)
        if k is None:
            out.append(c)
            continue
        verdict, ests = pooled_verdict(res, SCORECARD[k])
        dev = [Estimate(f"development run: {e.label}", e.d, e.lo, e.hi, e.scale, e.unit) for e in (*c.estimates, *c.beside)]
        dev = pooled_verdict(res, BESIDE[k])[1] + dev if k in BESIDE else dev
        evidence = (f"pooled over {len(res['seeds'])} training runs (data seeds {', '.join(map(str, res['seeds']))}), "
                    f"random effects with HKSJ 95% intervals, Holm over the row's comparisons; this build's run "
                    f"(the development seed) beside, not in the verdict: {c.evidence}")
        out.append(Claim(c.claim, c.source, evidence, verdict, PAGE, block=c.block, claimed=c.claimed, estimates=ests,
                         beside=dev))
    return out


def direction(r: dict) -> str:
    """The verb a sentence of the page glues for a pooled claim: its HKSJ interval above 0 "raises", below 0
    "lowers", else "does not detectably change"."""
    return "raises" if r["lo"] > 0 else "lowers" if r["hi"] < 0 else "does not detectably change"


def development(cfg, res: dict) -> pd.DataFrame:
    """This build's own run (the development seed) beside the pooled claims it can be compared with: its estimate
    with a 95% question-bootstrap interval, the pooled prediction interval for one new run, and whether it falls
    inside. Its "fixed s0" row holds s_0 where the position mask allows it (the study's "hold s0" never
    substitutes), so that comparison is labelled as such. Empty when this build has no exploration samples."""
    from ctrls.config.settings import BASE, FIXED, row_label
    from ctrls.stages.exploration import load_samples
    from ctrls.stats.agreement import kappa_vs_null, null_steps
    from ctrls.stats.paired import paired_pass

    try:
        df = load_samples(cfg)
    except (FileNotFoundError, ValueError):
        return pd.DataFrame()
    df = df[(df.dataset == cfg.data.dataset) & (df.trained_on == cfg.data.dataset)]
    eps = cfg.grid.epsilons[0] if cfg.grid.epsilons else None
    if eps is None or df.empty:
        return pd.DataFrame()
    row, base, fixed = (df[df.config == c] for c in (row_label(eps), BASE, FIXED))
    n = int(row.groupby("question_id").size().min())
    got = {"eps_minus_base_pass_n": paired_pass(row, base, n)}
    if not fixed.empty:
        got["eps_minus_hold_s0_pass1"] = paired_pass(row, fixed, 1)
        got["hold_s0_minus_base_pass1"] = paired_pass(fixed, base, 1)
    k = kappa_vs_null(*null_steps(row, base, eps))
    got["kappa"] = {"diff": k["kappa"], "lo": k["kappa lo"], "hi": k["kappa hi"], "questions": k["questions"]}
    rows = []
    for key, d in got.items():
        r = res["claims"][key]
        kap = key == "kappa"
        f = (lambda x: f"{x:+.2f}".replace("-", "−")) if kap else (lambda x: f"{100 * x:+.1f}".replace("-", "−"))
        what = MEANING[key][0]
        if key in ("eps_minus_hold_s0_pass1", "hold_s0_minus_base_pass1"):
            what = what.replace("hold s₀", "fixed s₀ (masked)")
        inside = r["pred_lo"] is not None and r["pred_lo"] <= d["diff"] <= r["pred_hi"]
        rows.append({"claim": what, "questions": int(d["questions"]),
                     "this build's run [95% CI]": f"{f(d['diff'])} [{f(d['lo'])}, {f(d['hi'])}]",
                     "one new run, 95% PI": "–" if r["pred_lo"] is None else f"[{f(r['pred_lo'])}, {f(r['pred_hi'])}]",
                     "inside": "yes" if inside else "no"})
    return pd.DataFrame(rows)


def rl_frame(res: dict) -> pd.DataFrame:
    """Per seed: the constant state chosen on the validation half, RL's end policy minus it on the test half, and
    RL's end policy minus the pretrained CTRLS(ε) row (points, with ±1.96 SE over questions), with the learned c."""
    best = {s["data_seed"]: s["best_constant"] for s in res["states"]}
    c = {p["data_seed"]: p.get(RL_END, {}).get("c") for p in res.get("rl_policies", [])}
    pre = {p["data_seed"]: p.get("pretrained", {}).get("c") for p in res.get("rl_policies", [])}
    rows = []
    for a, b in zip(res["claims"]["rl_minus_best_constant_pass1"]["per_seed"],
                    res["claims"]["rl_minus_pretrained_pass1"]["per_seed"]):
        f = lambda x: f"{100 * x['estimate']:+.1f} ± {196 * x['se']:.1f}".replace("-", "−")  # noqa: E731
        rows.append({"data seed": a["data_seed"], "best constant state (validation)": best.get(a["data_seed"]),
                     "RL − best constant (test half)": f(a), "RL − pretrained CTRLS(ε)": f(b),
                     "c before RL": pre.get(a["data_seed"]), "c after RL": c.get(a["data_seed"])})
    return pd.DataFrame(rows)


RL_END = "ε=0.1, H=0.01"  # the demo's default RL setting, as Table 2 labels it


__all__ = ["MEANING", "POOLED_RESULT", "claims_frame", "forest", "lottery", "method_claims", "numbers", "per_seed_frame",
           "pooled", "pooled_verdict", "rl_frame", "development", "direction", "states_frame"]
