"""What the run pages say about what ran, computed from the runs: the exploration page's headline box
(the comparison with the smallest Holm-adjusted p of each family, not the first row of a table), the
RL page's list of the settings that ran (never "the four curves" when two ran), and the folded box of
the other comparisons (a dropdown, not a folded code cell)."""
from __future__ import annotations

import math

import pandas as pd

from ctrls.report import verdicts
from ctrls.report.words import say


def _key(p, d, order: int) -> tuple:
    """Smaller matters more: the Holm-adjusted p, then the larger |difference|, then page order."""
    p = 1.0 if p is None or (isinstance(p, float) and math.isnan(p)) else float(p)
    d = 0.0 if d is None or (isinstance(d, float) and math.isnan(d)) else abs(float(d))
    return (p, -d, order)


def exploration_families(table: pd.DataFrame, ablation: pd.DataFrame, control: pd.DataFrame) -> list[tuple]:
    """(family, key) for every sentence of ``verdicts.exploration_sentences``, in its order: ``None``
    for the Base rows (no comparison), ``"table1"``, ``"ablation"`` (both metrics: the ablation table is one
    Holm family) and ``"control"``, each keyed by :func:`_key`."""
    out = [(None, None)] * int((table.config == "Base").sum())
    out += [("table1", _key(r["p (Holm)"], r["Δ pass@n vs Base"], i))
            for i, (_, r) in enumerate(table[table.p.notna()].iterrows())]
    out += [("ablation", _key(r[f"p ({m}, Holm)"], r[f"Δ {m}"], 2 * i + j))
            for i, (_, r) in enumerate(ablation.iterrows()) for j, m in enumerate(("pass@n", "Succ."))]
    if "Δ vs Base" in control:
        for i, (_, r) in enumerate(control[control["Δ vs Base"].notna()].iterrows()):
            out.append(("control", _key(r["p (Holm)"], r["Δ vs Base"], i)))
            if "κ" in r and not pd.isna(r["κ"]):  # the claim's own test, against the independent-chain null
                out.append(("control κ", _key(r["p (κ, Holm)"], r["κ"], i)))
    return out


def exploration_headlines(table: pd.DataFrame, ablation: pd.DataFrame,
                          control: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The exploration page's box: for each family (Table 1 against Base, the ablation, controllability:
    its κ against the independent-chain null where the table has it, the claim's test) the sentence of the
    comparison with the smallest Holm-adjusted p (ties: the larger |difference|, then page order), in page
    order; and every other sentence, to fold."""
    every = verdicts.exploration_sentences(table, ablation, control)
    fam = exploration_families(table, ablation, control)
    if len(fam) != len(every):  # the sentences changed shape: the verdicts module's own choice
        return verdicts.exploration_highlights(table, ablation, control)
    keep = []
    kinds = {f for f, _ in fam}
    for family in ("table1", "ablation", "control κ" if "control κ" in kinds else "control"):
        cands = [(key, i) for i, (f, key) in enumerate(fam) if f == family]
        if cands:
            keep.append(min(cands)[1])
    keep = sorted(keep)
    return [every[i] for i in keep], [s for i, s in enumerate(every) if i not in keep]


def folded(sentences: list[str], title: str) -> str:
    """A dropdown box (closed until clicked) with one bullet per sentence: the page shows its title only,
    and no code. Its cell renders Markdown as MyST (cell metadata ``mystnb.markdown_format: myst``)."""
    if not sentences:
        return ""
    return say("pages", "folded", title=title, bullets="\n".join("- " + s for s in sentences)) + "\n"


def rl_settings_note(curves: pd.DataFrame, planned: list[str]) -> str:
    """Which of the paper's four RL settings ran, with their ε and α, from the curves (``planned``:
    ``rl.settings``); a setting that was asked for and has no curve is named too."""
    ran = curves.groupby("setting", sort=False)[["epsilon", "alpha"]].first()
    text = (f"{len(ran)} setting{'s' if len(ran) != 1 else ''} ran: "
            + "; ".join(f"`{name}` (ε = {e:g}, α = {a:g})" for name, (e, a) in ran.iterrows()) + ".")
    missing = [s for s in planned if s not in ran.index]
    if missing:
        text += " Asked for but not in the curves: " + ", ".join(f"`{s}`" for s in missing) + "."
    paper = ["none", "epsilon", "entropy", "both"]
    absent = [s for s in paper if s not in ran.index and s not in missing]
    if absent:
        text += (" The paper's other setting" + ("s" if len(absent) > 1 else "") + ", "
                 + ", ".join(f"`{s}`" for s in absent) + ", " + ("run" if len(absent) > 1 else "runs")
                 + " in the `paper` profile, which runs all four.")
    return text




# ---- the pretraining page's stored studies --------------------------------------------------------

NOT_STORED = "This study's result is not stored with the book (the note at the top of the page lists what is)."


def _pct(v: float, lo: float | None = None, hi: float | None = None, d: int = 1) -> str:
    if lo is None or hi is None:
        return f"{100 * v:.{d}f}"
    return f"{100 * v:.{d}f} [{100 * lo:.{d}f}, {100 * hi:.{d}f}]"


def _wilson(rate: float, n) -> tuple[float | None, float | None]:
    from ctrls.stats.power import wilson_interval

    if n is None or not n:
        return None, None
    lo, hi = wilson_interval(round(rate * n), int(n))
    return float(lo), float(hi)


def injection_view(df: pd.DataFrame) -> pd.DataFrame:
    """The injection study's rows (``ctrls.report.studies.injection_frame``) for the page: what the step's
    own state adds over shuffled states and what any state adds over the backbone (nats/token), then every
    rate in % with its 95% interval. The follows and coincidence intervals are the study's own
    (question-clustered Wilson); pass@1 and Succ. get a Wilson interval with each test question's samples
    counted as one observation (the conservative end: the study stores rates, not per-question counts)."""
    from ctrls.report.studies import chance_corrected

    q = df.attrs.get("questions")
    rows = []
    for r in df.to_dict("records"):
        where = r["injection"].replace("(Alg. 1)", "(our reading of Alg. 2)")  # the paper's words: the page's text
        rows.append({"injected at": where,
                     "own state − shuffled (nats/token)": f"{r['posterior'] - r['shuffled']:+.3f}".replace("-", "−"),
                     "any state − backbone (nats/token)": f"{r['shuffled']:+.3f}".replace("-", "−"),
                     "follows its state (%)": _pct(r["follows"], r["follows_lo"], r["follows_hi"]),
                     "by coincidence (%)": _pct(r["coincidence"], r["coincidence_lo"], r["coincidence_hi"]),
                     "κ": f"{float(chance_corrected(r['follows'], r['coincidence'])):.2f}".replace("-", "−"),
                     "pass@1 (%)": _pct(r["pass@1"], *_wilson(r["pass@1"], q), d=0),
                     "Succ. (%)": _pct(r["Succ."], *_wilson(r["Succ."], q), d=0)})
    out = pd.DataFrame(rows)
    base = df.iloc[0]
    def pct_ci(v):
        a, b = _wilson(v, q)
        return f"{100 * v:.0f}%" + ("" if a is None else f" [{100 * a:.0f}, {100 * b:.0f}]")

    out.attrs["note"] = (f"Base in this harness: pass@1 {pct_ci(base['Base pass@1'])}, Succ. {pct_ci(base['Base Succ.'])}. "
                         f"The pass@1 and Succ. intervals count each of the {q} test questions once.")
    return out


def concentration_view(df: pd.DataFrame) -> pd.DataFrame:
    """The concentration study's points (``ctrls.report.studies.concentration_frame``) in %, every rate with
    its 95% interval (pass@1: Wilson at the row's number of samples)."""
    return pd.DataFrame({"c": df["c"], "row": df["row"], "steps": df["steps"],
                         "follows its state (%)": [_pct(r.follows, r.follows_lo, r.follows_hi) for r in df.itertuples()],
                         "by coincidence (%)": [_pct(r.coincidence, r.coincidence_lo, r.coincidence_hi)
                                                for r in df.itertuples()],
                         "pass@1 (%)": [_pct(p, *_wilson(p, n), d=0) for p, n in zip(df["pass@1"], df["samples"])]})


def k_sweep_sentence(ks: pd.DataFrame, demo_k: int | None = None) -> str:
    """The K sweep in one sentence: the K that steers most by κ (``ctrls.report.studies.steering_k``, the
    page's rule) and whether the demo uses it."""
    from ctrls.report.studies import steering_k

    if ks.empty:
        return ""
    best = steering_k(ks)
    text = say("pages", "k sweep", K=int(best.K), kappa=format(best.kappa, ".2f").replace("-", "−"),
               follows=format(100 * best.follows, ".1f") + "%", coincidence=format(100 * best.coincidence, ".1f") + "%")
    if demo_k is not None:
        text += say("pages", "k sweep.same" if demo_k == int(best.K) else "k sweep.other", K=demo_k)
    return text


def fusion_sentence(fu: pd.DataFrame) -> str:
    """The fusion comparison in one sentence per K: which F_u steers more by κ, and whether the two follows
    intervals overlap."""
    from ctrls.report.studies import chance_corrected

    out = []
    for K, g in fu.groupby("K", sort=True):
        if len(g) != 2:
            continue
        g = g.assign(kappa=chance_corrected(g.follows, g.coincidence)).sort_values("kappa", ascending=False)
        hi, lo = g.iloc[0], g.iloc[1]
        overlap = hi.follows_lo <= lo.follows_hi and lo.follows_lo <= hi.follows_hi
        out.append(say("pages", "fusion.overlap" if overlap else "fusion.apart", K=int(K), fusion=hi.fusion,
                       hi=format(hi.kappa, ".2f"), lo=format(lo.kappa, ".2f")))
    return " ".join(out)


# ---- the RL page ---------------------------------------------------------------------------------------


def rl_verdicts_table(t: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """``ctrls.report.verdicts.rl_verdicts_view`` of :func:`ctrls.report.verdicts.rl_verdicts`' table, with each accuracy
    in % beside its 95% interval: the seeds' samples pooled per question, as the verdicts pool them
    (``ctrls.report.plots.pooled_accuracy``: Wilson at the question-clustered effective size)."""
    from ctrls.report.plots import pair_title, pooled_accuracy
    from ctrls.report.verdicts import rl_verdicts_view as view

    v = view(t)
    ev = curves[curves.kind == "eval"] if "kind" in curves else curves
    for col, pick in (("accuracy at step 0 (%)", "first"), ("accuracy at the end (%)", "last")):
        cells = []
        for _, r in t.iterrows():
            g = ev[(ev["pair"] == r["pair"]) & (ev.setting == r["setting"])]
            p = pooled_accuracy(g)
            row = p.iloc[0] if pick == "first" else p[p.step == r["last step"]].iloc[0]
            cells.append(_pct(row.rate, row.lo, row.hi))
        v[col] = cells
    if t["pair"].nunique() > 1:
        v.insert(0, "backbone, dataset", t["pair"].map(pair_title).to_numpy())
    return v


__all__ = ["NOT_STORED", "concentration_view", "rl_verdicts_table", "exploration_families", "exploration_headlines", "folded",
           "fusion_sentence", "injection_view", "k_sweep_sentence", "rl_settings_note"]
