"""The paper's reported numbers, in one place: Tables 1-3 (pass@20 and Succ. in percent; Table 3's
rubric scores), the test-set sizes they were computed on, and the case studies' questions. The
tables' builders (``ctrls.report.tables``) and the power analysis (``ctrls.stats.power``) read them here.

Also the paper's own numbering of its sections, appendices, figures, tables, algorithms and
equations (``PAPER_SECTIONS`` ... ``PAPER_EQUATIONS``) and what the companion cites by it
(``PAPER_REFS``), so that every page cites the paper by the paper's numbers.
"""
from __future__ import annotations

import re

import pandas as pd

from ctrls.config.settings import BASE, setting_label

# Table 1 of the paper (pass@20 and Succ., in %), keyed by (backbone, dataset, eta, row).
PAPER_TABLE1 = {
    ("Llama-3.2-3B-Instruct", "gsm8k"): {
        0.5: {BASE: (72.5, 95.0), "eps=0.1": (77.5, 100.0), "eps=0.3": (75.0, 100.0), "eps=0.5": (82.5, 100.0)},
        0.7: {BASE: (77.5, 100.0), "eps=0.1": (77.5, 100.0), "eps=0.3": (70.0, 100.0), "eps=0.5": (85.0, 100.0)}},
    ("Llama-3.2-3B-Instruct", "math"): {
        0.5: {BASE: (50.0, 90.0), "eps=0.1": (47.5, 95.0), "eps=0.3": (60.0, 95.0), "eps=0.5": (52.5, 90.0)},
        0.7: {BASE: (47.5, 97.5), "eps=0.1": (50.0, 97.5), "eps=0.3": (60.0, 97.5), "eps=0.5": (47.5, 90.0)}},
    ("Qwen2.5-3B-Instruct", "gsm8k"): {
        0.5: {BASE: (87.5, 100.0), "eps=0.1": (90.0, 100.0), "eps=0.3": (87.5, 100.0), "eps=0.5": (87.5, 100.0)},
        0.7: {BASE: (80.0, 100.0), "eps=0.1": (85.0, 97.5), "eps=0.3": (82.5, 97.5), "eps=0.5": (80.0, 97.5)}},
    ("Qwen2.5-3B-Instruct", "math"): {
        0.5: {BASE: (65.0, 65.0), "eps=0.1": (57.5, 60.0), "eps=0.3": (62.5, 52.5), "eps=0.5": (65.0, 75.0)},
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
def paper_table2_layout() -> pd.DataFrame:
    """The paper's Table 2 as printed: a row per policy, a column pair (pass@20, Succ.) per
    (backbone, dataset)."""
    wide = paper_table2().pivot_table(index="config", columns=["backbone", "dataset"],
                                      values=["paper pass@20", "paper Succ."], sort=False)
    return wide.swaplevel(0, 1, axis=1).sort_index(axis=1, level=0, sort_remaining=False)


# ---- The paper's own numbering (AISTATS 2026 version, read by hand from its LaTeX) ----------------
# Sections and subsections in order; \appendix switches to letters (A, B, ...). Floats are numbered
# in source order: figures (figure and figure*), tables, algorithms; numbered equations are
# equation, multline and each row of align without \nonumber. tests/report/test_paper.py checks these
# tables against the LaTeX where it is available, and the book's references against PAPER_REFS.
PAPER_SECTIONS = {
    "1": "Introduction",
    "2": "Related Work",
    "3": "Preliminary",
    "3.1": "Chain-of-thought Reasoning",
    "3.2": "Distributional Reinforcement Learning",
    "4": "Formulation: Transition-aware Chain-of-Thought as an MDP",
    "5": "CTRLS: Chain-of-Thought Reasoning via Latent State Transition",
    "5.1": "Mathematical Assumptions",
    "5.2": "Latent State Encoding",
    "5.3": "State-aware Chain-of-thought Alignment",
    "5.4": "On-Policy Chain-of-thought Reinforcement Learning",
    "6": "Experiments",
    "6.1": "Experimental Setup",
    "6.2": "State Transition-aware Exploration",
    "6.3": "Impact of Exploration Configurations",
    "6.4": "Case Study",
    "7": "Conclusion",
    "A": "Evidence Lower Bound (ELBO) Derivation",
    "B": "Algorithm of CTRLS Pre-training",
    "C": "Algorithm of CTRLS for On-policy Reinforcement Learning",
    "C.1": "On-policy Reinforcement Learning",
    "D": "Case Study",
    "E": "GPT-as-judge Evaluation Details",
    "F": "Implementation Details",
}

# Figures by number: the first words of the caption (figure-level, not the subfigures').
PAPER_FIGURES = {
    1: "Illustration of the difference between conventional CoT prompting and CTRLS",
    2: "An overview of the proposed two-phase alignment and fine-tuning scheme",
    3: "Qualitative comparison. CTRLS correctly verifies candidate solutions",  # n^2 - 3n + 2, Qwen2.5, Sec. 6.4
    4: "On-policy learning curves for CTRLS with LlaMA3.2 and Qwen2.5",  # App. C.1, GSM8K; (a) Llama, (b) Qwen
    5: "On-policy reinforcement learning curves for LlaMA3.2 and Qwen2.5 on MATH",  # App. C.1
    6: "Qualitative comparison. CTRLS corrects a symbolic substitution error",  # a_4/a_2 = 3, Llama, App. D
    7: "Qualitative comparison. CTRLS avoids hallucinated symbolic reasoning",  # sqrt(63 - sqrt(x)), App. D
}

PAPER_TABLES = {
    1: "Comparison of exploration accuracy and success rate of CTRLS and the base models",  # Sec. 6.2
    2: "RL performance under entropy regularization (left block) and ε-greedy exploration",  # Sec. 6.3
    3: "GPT-4 rubric scores (0–10) on GSM8K with Qwen",  # Sec. 6.4, App. E
}

PAPER_ALGORITHMS = {1: "Offline CTRLS Pretraining", 2: "On-Policy RL Fine-tuning for CTRLS"}  # App. B, App. C

# Numbered equations: what each is, and its LaTeX label where it has one. Eqs. 9-10 are the two
# numbered rows of one align (eq:joint_factorization).
PAPER_EQUATIONS = {
    1: ("CoT step sampling x_t ~ mu", None),
    2: ("distributional action a_t ~ pi_theta", None),
    3: ("distributional Bellman operator", "eq:bellman"),
    4: ("objective J(theta), expected terminal accuracy", "eq:objective"),
    5: ("spectrum embedding e_t", "eq:spectrum_embedding"),
    6: ("transition and emission factorisation", "eq:inference"),
    7: ("Markov transition P_theta(s_t | s_{t-1})", None),
    8: ("U-Net injection E' = F_u([F_d(E); z_t])", "eq:unet_injection"),
    9: ("one-step factorisation mu(x_t | H_{t-1}) P_theta(s_t | s_{t-1})", "eq:joint_factorization"),
    10: ("H_{t-1}, the rewritten hidden states", None),
    11: ("ELBO (Theorem 5.3)", "eq:elbo"),
    12: ("reward R = 1{y = y*}", None),
    13: ("epsilon-greedy mixture pi~", None),
    14: ("entropy H(pi_theta(s_t))", None),
    15: ("RL objective with entropy bonus", None),
    16: ("REINFORCE policy gradient", "eq:pg"),
}

# What the companion cites, by topic -> the paper's own reference ("Sec." for a section of the
# body, "App." for an appendix, "Fig."/"Figs." for figures, "Table", "Eq.", "Alg.", "Thm.").
PAPER_REFS = {
    "method": "Sec. 5",
    "latent state encoding": "Sec. 5.2",
    "transition model": "Sec. 5.3",
    "on-policy RL": "Sec. 5.4",
    "epsilon-greedy exploration": "Sec. 5.4",
    "experimental setup": "Sec. 6.1",
    "state transition-aware exploration": "Sec. 6.2",
    "exploration configurations": "Sec. 6.3",
    "case study": "Sec. 6.4",
    "case study examples": "App. D",
    "case study figures": "Figs. 3, 6, 7",
    "self-reflection case (n^2 - 3n + 2)": "Fig. 3",
    "arithmetic sequence case (a_4/a_2 = 3)": "Fig. 6",
    "sqrt(63 - sqrt(x)) case": "Fig. 7",
    "ELBO derivation": "App. A",
    "pretraining algorithm": "App. B",
    "RL algorithm": "App. C",
    "RL learning curves": "App. C.1",
    "RL learning curves figures": "Figs. 4-5",
    "collapse without entropy regularisation": "App. C.1",
    "judge": "App. E",
    "implementation details": "App. F",
    "exploration table": "Table 1",
    "RL table": "Table 2",
    "judge table": "Table 3",
    "pretraining": "Alg. 1",
    "RL": "Alg. 2",
    "ELBO": "Thm. 5.3",
    "spectrum embedding": "Eq. 5",
    "U-Net injection": "Eq. 8",
    "ELBO equation": "Eq. 11",
    "epsilon-greedy mixture": "Eq. 13",
    "entropy": "Eq. 14",
    "RL objective": "Eq. 15",
    "policy gradient": "Eq. 16",
}


def ref_targets(ref: str) -> list[tuple[str, str]]:
    """The (kind, number) pairs a reference names: "Figs. 4-5" -> [("Fig", "4"), ("Fig", "5")],
    "App. C.1" -> [("App", "C.1")], "Sec. 6.3" -> [("Sec", "6.3")]."""
    kind, _, rest = ref.partition(" ")
    kind = {"Figs.": "Fig", "Fig.": "Fig", "Sec.": "Sec", "App.": "App", "Eq.": "Eq", "Eqs.": "Eq",
            "Alg.": "Alg", "Thm.": "Thm", "Table": "Table", "Tables": "Table"}[kind]
    out = []
    for part in re.split(r",\s*|\s+and\s+", rest):
        a, dash, b = part.partition("-")
        if dash and a.isdigit() and b.isdigit():
            out += [(kind, str(i)) for i in range(int(a), int(b) + 1)]
        else:
            out.append((kind, part))
    return out
