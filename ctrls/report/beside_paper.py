"""Ours beside the paper's: Tables 1-3 of our runs (``ctrls.report.tables``) next to the paper's numbers
(``ctrls.report.paper``), one table per (backbone, dataset) of ours, for the summary and judge pages."""
from __future__ import annotations

import pandas as pd

from ctrls.config.schema import Config
from ctrls.generate.judge import CRITERIA
from ctrls.report.paper import PAPER_TABLE3, paper_table1, paper_table2
from ctrls.report.provenance import with_pct_ci
from ctrls.report.tables import rubric_table, table1, table2

PAPER_NAMES = {"Llama-3.2-3B-Instruct": "Llama-3.2", "Qwen2.5-3B-Instruct": "Qwen2.5"}


def _beside_paper(ours: pd.DataFrame, paper: pd.DataFrame, on: list[str]) -> dict[str, pd.DataFrame]:
    """One table per (backbone, dataset) of ours, under a heading naming them: our pass@n and Succ.
    (percent, with 95% intervals) and, one column per number, the paper's pass@20 and Succ. for each
    of its backbones on the same dataset (the paper has no run on our backbone)."""
    out = {}
    for (b, ds), g in with_pct_ci(ours).groupby(["backbone", "dataset"], sort=False):
        t = g[[*on, "questions", "samples", "pass@n (%)", "Succ. (%)"]].rename(
            columns={"pass@n (%)": "ours pass@n (%)", "Succ. (%)": "ours Succ. (%)"})
        for pb, p in paper[paper.dataset == ds].groupby("backbone", sort=False):
            name = PAPER_NAMES.get(pb, pb)
            cols = {"paper pass@20": f"{name} pass@20", "paper Succ.": f"{name} Succ."}
            t = t.merge(p[[*on, *cols]].rename(columns=cols), on=on, how="left")
        theirs = [PAPER_NAMES.get(x, x) for x in paper[paper.dataset == ds].backbone.unique()]
        out[f"ours: {b} × {ds}; " + (f"paper: {', '.join(theirs)} × {ds}" if theirs else
                                     f"the paper has no run on {ds}")] = t
    return out


def table1_vs_paper(samples: pd.DataFrame, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Table 1, ours beside the paper's (``ctrls.report.paper.PAPER_TABLE1``), per (backbone, dataset)."""
    return _beside_paper(table1(samples, seed=seed), paper_table1(), ["temperature", "config"])


def table2_vs_paper(cfg: Config) -> dict[str, pd.DataFrame]:
    """Table 2, ours beside the paper's (``ctrls.report.paper.PAPER_TABLE2``), per (backbone, dataset)."""
    return _beside_paper(table2(cfg), paper_table2(), ["config"])


def all_defaults(judged: pd.DataFrame) -> bool:
    """Whether no judge could score: every criterion of every judgement fell back to the scale's midpoint
    (``ctrls.generate.judge.DEFAULT_SCORE``), so the scores are the default, not a judge's."""
    cols = [f"parse_{k}" for k in CRITERIA if f"parse_{k}" in judged]
    if len(judged) == 0:
        return False
    if cols:
        return bool((judged[cols] == "default").all(axis=None))
    return bool((judged.get("parse") == "default").all()) if "parse" in judged else False


def judge_statement(judged: pd.DataFrame) -> str:
    """One plain sentence when no judge could score (:func:`all_defaults`), else ""."""
    if not all_defaults(judged):
        return ""
    from ctrls.generate.judge import DEFAULT_SCORE

    return (f"**No judge could score these outputs.** Every one of the {len(judged)} replies failed to give a "
            f"readable score on any of the {len(CRITERIA)} criteria, so each score fell back to the default "
            f"{DEFAULT_SCORE:g}. This page therefore has no Table 3 of ours; the paper's scores are shown alone.")


def table3_vs_paper(judged: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Table 3: our rubric scores (mean [95% interval]) beside the paper's GPT-4 scores, by setting;
    a setting in only one of the two has empty cells in the other's columns. When no judge could score
    (:func:`all_defaults`) or every score is equal, our score columns would be the same number with
    zero-width intervals: they are left out, with the number of judged outputs, and a note says why."""
    scores = pd.unique(judged[list(CRITERIA)].to_numpy().ravel()) if len(judged) else []
    if len(judged) and (all_defaults(judged) or len(scores) == 1):
        n = judged.groupby("config").size().rename("n (ours)").rename_axis("setting").reset_index()
        paper3 = PAPER_TABLE3.rename(columns={c: f"{c} (paper)" for c in PAPER_TABLE3.columns if c != "setting"})
        out = n.merge(paper3, on="setting", how="outer")
        out.attrs["note"] = ("No judge could score our outputs: every score is the default, so our columns are "
                             "left out and the paper's scores are shown alone." if all_defaults(judged) else
                             f"Our judge gave every one of its {len(judged)} outputs the same score, {scores[0]:g}, "
                             f"on all {len(CRITERIA)} criteria, so our columns are left out and the paper's scores "
                             "are shown alone.")
        return out
    ours = rubric_table(judged, seed=seed).rename(columns={"config": "setting"})
    return ours.merge(PAPER_TABLE3, on="setting", how="outer", suffixes=(" (ours)", " (paper)"))
