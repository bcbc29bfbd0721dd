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


def table3_vs_paper(judged: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Table 3: our rubric scores (mean [95% interval]) beside the paper's GPT-4 scores, by setting;
    a setting in only one of the two has empty cells in the other's columns."""
    ours = rubric_table(judged, seed=seed).rename(columns={"config": "setting"})
    scores = pd.unique(judged[list(CRITERIA)].to_numpy().ravel())
    if len(judged) and len(scores) == 1:
        # every score equal: our columns would all read "x [x, x]"; one sentence says so instead
        keep = ours[["setting", "n"]].rename(columns={"n": "n (ours)"})
        paper3 = PAPER_TABLE3.rename(columns={c: f"{c} (paper)" for c in PAPER_TABLE3.columns if c != "setting"})
        out = keep.merge(paper3, on="setting", how="outer")
        out.attrs["note"] = (f"Our judge gave every one of its {len(judged)} outputs ({judged.config.nunique()} settings) "
                             f"the same score, {scores[0]:g}, on all {len(CRITERIA)} criteria, so our score columns "
                             "would all read the same with zero-width intervals; they are left out, and the "
                             "paper's scores are shown alone.")
        return out
    return ours.merge(PAPER_TABLE3, on="setting", how="outer", suffixes=(" (ours)", " (paper)"))
