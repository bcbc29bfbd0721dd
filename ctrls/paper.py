"""The paper's reported numbers, in one place: Tables 1-3 (pass@20 and Succ. in percent; Table 3's
rubric scores), the test-set sizes they were computed on, and the case studies' questions. The
tables' builders (``ctrls.tables``) and the power analysis (``ctrls.power``) read them here.
"""
from __future__ import annotations


import pandas as pd

from ctrls.settings import BASE, setting_label




# Table 1 of the paper (pass@20 and Succ., in %), keyed by (backbone, dataset, eta, row).
PAPER_TABLE1 = {
    ("Llama-3.2-3B-Instruct", "gsm8k"): {0.5: {BASE: (72.5, 95.0), "eps=0.1": (77.5, 100.0), "eps=0.3": (75.0, 100.0), "eps=0.5": (82.5, 100.0)},
                                         0.7: {BASE: (77.5, 100.0), "eps=0.1": (77.5, 100.0), "eps=0.3": (70.0, 100.0), "eps=0.5": (85.0, 100.0)}},
    ("Llama-3.2-3B-Instruct", "math"): {0.5: {BASE: (50.0, 90.0), "eps=0.1": (47.5, 95.0), "eps=0.3": (60.0, 95.0), "eps=0.5": (52.5, 90.0)},
                                        0.7: {BASE: (47.5, 97.5), "eps=0.1": (50.0, 97.5), "eps=0.3": (60.0, 97.5), "eps=0.5": (47.5, 90.0)}},
    ("Qwen2.5-3B-Instruct", "gsm8k"): {0.5: {BASE: (87.5, 100.0), "eps=0.1": (90.0, 100.0), "eps=0.3": (87.5, 100.0), "eps=0.5": (87.5, 100.0)},
                                       0.7: {BASE: (80.0, 100.0), "eps=0.1": (85.0, 97.5), "eps=0.3": (82.5, 97.5), "eps=0.5": (80.0, 97.5)}},
    ("Qwen2.5-3B-Instruct", "math"): {0.5: {BASE: (65.0, 65.0), "eps=0.1": (57.5, 60.0), "eps=0.3": (62.5, 52.5), "eps=0.5": (65.0, 75.0)},
                                      0.7: {BASE: (72.5, 67.5), "eps=0.1": (62.5, 65.0), "eps=0.3": (62.5, 67.5), "eps=0.5": (77.5, 67.5)}},
}


def paper_table1() -> pd.DataFrame:
    rows = []
    for (b, ds), by_eta in PAPER_TABLE1.items():
        for eta, by_row in by_eta.items():
            for label, (p20, succ) in by_row.items():
                rows.append({"backbone": b, "dataset": ds, "temperature": eta, "config": label,
                             "paper pass@20": p20, "paper Succ.": succ})
    return pd.DataFrame(rows)


def paper_layout() -> pd.DataFrame:
    p = paper_table1()
    p = p.assign(model=p.backbone + " · " + p.dataset)
    wide = p.pivot_table(index=["temperature", "config"], columns="model", values=["paper pass@20", "paper Succ."],
                         aggfunc="first", sort=False)
    wide = wide.swaplevel(0, 1, axis=1).sort_index(axis=1, level=0, sort_remaining=False)
    wide.index = wide.index.set_names(["η", "exploration"])
    return wide


# Table 2 of the paper (pass@20, Succ. in %), after RL, by (epsilon, alpha): the paper's rows
# "H=0.0" and "H=0.01" have epsilon 0, its rows "ε=0.1" and "ε=0.3" have alpha 0.
PAPER_TABLE2 = {
    "Llama-3.2-3B-Instruct": {"gsm8k": {"Base": (55.6, 80.0), (0.0, 0.0): (57.6, 80.8), (0.0, 0.01): (56.8, 79.6),
                                        (0.1, 0.0): (57.4, 80.4), (0.3, 0.0): (55.8, 79.4)},
                              "math": {"Base": (41.0, 71.8), (0.0, 0.0): (42.8, 72.2), (0.0, 0.01): (42.6, 74.0),
                                       (0.1, 0.0): (43.0, 73.4), (0.3, 0.0): (42.0, 71.2)}},
    "Qwen2.5-3B-Instruct": {"gsm8k": {"Base": (64.2, 91.8), (0.0, 0.0): (65.8, 89.6), (0.0, 0.01): (66.4, 90.2),
                                      (0.1, 0.0): (66.2, 89.8), (0.3, 0.0): (66.0, 90.2)},
                            "math": {"Base": (22.6, 33.8), (0.0, 0.0): (22.8, 33.4), (0.0, 0.01): (23.6, 34.6),
                                     (0.1, 0.0): (22.2, 32.2), (0.3, 0.0): (23.4, 34.2)}},
}


def paper_table2() -> pd.DataFrame:
    """The paper's Table 2 in long form, its rows labelled by ``setting_label`` like ours."""
    return pd.DataFrame([{"backbone": b, "dataset": d, "config": c if c == "Base" else setting_label(*c),
                          "paper pass@20": v[0], "paper Succ.": v[1]}
                         for b, by_d in PAPER_TABLE2.items() for d, rows in by_d.items() for c, v in rows.items()])


# Table 3 of the paper: GPT-4 rubric scores on GSM8K with Qwen2.5-3B-Instruct, 100 samples per
# setting (epsilon: exploration rate of the RL policy, H: entropy weight). Copied from the LaTeX.
PAPER_TABLE3 = pd.DataFrame(
    [("Base", 7.62, 8.44, 8.23, 8.51, 8.05),
     ("ε=0.0, H=0.0", 7.82, 8.83, 8.43, 8.66, 8.34),
     ("ε=0.1, H=0.0", 7.74, 8.65, 8.33, 8.51, 8.17),
     ("ε=0.1, H=0.01", 7.73, 8.54, 8.35, 8.55, 8.16),
     ("ε=0.3, H=0.0", 7.80, 8.77, 8.45, 8.68, 8.30),
     ("ε=0.3, H=0.01", 7.72, 8.73, 8.37, 8.60, 8.20)],
    columns=["setting", "S", "A", "C", "H", "Overall"])


PAPER_N = {"Table 1": 40, "Table 2": 500}  # test questions per table (from the grids of the values)


# The paper's two MATH case questions (Figures 6-7), found in the MATH data by these fragments.
PAPER_CASES = {
    "arithmetic sequence a4/a2 = 3 (Fig. 6)": ("arithmetic sequence", "\\frac{a_4}{a_2} = 3"),
    "sqrt(63 - sqrt(x)) (Fig. 7)": ("\\sqrt{63-\\sqrt{x}}",),
}


def paper_table2_layout() -> pd.DataFrame:
    """The paper's Table 2 as printed: a row per policy, a column pair (pass@20, Succ.) per
    (backbone, dataset)."""
    wide = paper_table2().pivot_table(index="config", columns=["backbone", "dataset"],
                                      values=["paper pass@20", "paper Succ."], sort=False)
    return wide.swaplevel(0, 1, axis=1).sort_index(axis=1, level=0, sort_remaining=False)
