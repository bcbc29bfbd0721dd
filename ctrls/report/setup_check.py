"""What the setup-check page shows: the benchmark data and the backbone's greedy answers."""
from __future__ import annotations

import re

import pandas as pd

from ctrls.config.schema import Config
from ctrls.data.answers import grade
from ctrls.data.problems import SPLITS as SPLIT_NAMES
from ctrls.data.problems import load_problems, local_dataset_dir, resolve_data_dir
from ctrls.data.prompts import prompt_ids
from ctrls.generate.sampling import SampleParams, sample
from ctrls.method.backbone import load_backbone
from ctrls.stages.common import problems_from_config

SPLITS = [("gsm8k", "train"), ("gsm8k", "test"), ("math", "train"), ("math", "test")]


def _splits(cfg: Config) -> list[tuple[str, str]]:
    """The built-in splits, then those of every dataset directory of the profile's grid."""
    own = [d for d in cfg.grid.datasets if local_dataset_dir(d) is not None]
    return SPLITS + [(d, split) for d in own for split in SPLIT_NAMES]


def dataset_table(cfg: Config) -> pd.DataFrame:
    """Size of every split, and the size of the seeded subsets this profile uses (a transfer dataset's test
    split: ``grid.transfer_questions``; "not used" where the profile uses none)."""
    rows = []
    for ds, split in _splits(cfg):
        probs = load_problems(ds, split, data_dir=cfg.data.data_dir)
        used = (cfg.data.n_train if split == "train" else cfg.data.n_test) if ds in cfg.grid.datasets else None
        if ds in cfg.grid.transfer_datasets and split == "test" and used is None:  # transfer: test questions only
            used = f"{cfg.grid.transfer_questions} (transfer)"
        rows.append({"dataset": ds, "split": split, "problems": len(probs),
                     "mean reference steps": round(sum(len(p.steps) for p in probs) / len(probs), 1),
                     "used by this profile": "not used" if used is None else used})
    return pd.DataFrame(rows)


def data_source(cfg: Config) -> str:
    """Where the benchmark data was read from, in words: a local data directory or the Hugging Face hub.
    Never a path: a resolved directory names the machine that built the book, not the reader's."""
    return "a local data directory" if resolve_data_dir(cfg.data.data_dir) else "the Hugging Face hub"


def example_problems(cfg: Config, n: int = 2) -> pd.DataFrame:
    rows = []
    for ds, split in _splits(cfg):
        for p in load_problems(ds, split, n=n, seed=cfg.data.seed, data_dir=cfg.data.data_dir):
            rows.append({"id": p.id, "question": _short(plain_tex(p.question)), "gold": plain_tex(p.answer),
                         "steps": len(p.steps)})
    return pd.DataFrame(rows)


def greedy_check(cfg: Config, n: int = 4) -> pd.DataFrame:
    """The backbone's greedy answers to the first ``n`` test questions of the profile's subset."""
    bb = load_backbone(cfg.backbone.name, cfg.backbone.device, cfg.backbone.dtype, cfg.backbone.cache_dir)
    probs = problems_from_config(cfg, "test")[:n]
    prompts = [prompt_ids(bb.tokenizer, p.question, cfg.prompt.use_chat_template, cfg.prompt.few_shot) for p in probs]
    params = SampleParams(temperature=0.0, max_new_tokens=cfg.sampling.max_new_tokens,
                          max_steps=cfg.prompt.max_steps, batch_size=cfg.sampling.batch_size)
    gens = sample(bb, prompts, 1, params)
    rows = []
    for p, (g,) in zip(probs, gens):
        gr = grade(g.text, p.answer)
        rows.append({"id": p.id, "question": _short(p.question), "gold": p.answer, "answer": gr.pred,
                     "valid": gr.valid, "correct": gr.correct, "steps": len(g.steps), "stop": g.finish})
    return pd.DataFrame(rows)


_TEX_SYMBOLS = {"cdot": "·", "times": "×", "div": "÷", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠",
                "neq": "≠", "pi": "π", "infty": "∞", "pm": "±", "theta": "θ", "alpha": "α", "beta": "β",
                "circ": "°", "dots": "…", "ldots": "…", "cdots": "⋯", "quad": " ", "qquad": " ", "%": "%",
                "$": "$", "{": "{", "}": "}", ",": " ", "!": "", ";": " ", " ": " "}
_SUPERSCRIPTS = str.maketrans("0123456789n", "⁰¹²³⁴⁵⁶⁷⁸⁹ⁿ")
_INLINE = re.compile(r"(?<!\\)\$\$?(.+?)(?<!\\)\$\$?", re.DOTALL)
_TEX_HINT = re.compile(r"[\\^_{}]|[a-zA-Z]\s*[=<>+\-*/]|[=<>+\-*/]\s*[a-zA-Z(]")


def _detex(m: str) -> str:
    """One TeX formula as plain text: fractions as a/b, roots as √, powers as superscripts."""
    for _ in range(3):  # nested fractions and roots
        m = re.sub(r"\\d?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}",
                   lambda g: f"{g[1]}/{g[2]}" if len(g[1] + g[2]) <= 4 else f"({g[1]})/({g[2]})", m)
        m = re.sub(r"\\sqrt\s*\{([^{}]*)\}", lambda g: "√" + (g[1] if len(g[1]) == 1 else f"({g[1]})"), m)
        m = re.sub(r"\\(?:text|mathrm|mathbf|textbf|operatorname)\s*\{([^{}]*)\}", r"\1", m)
    m = re.sub(r"\^\{?([0-9n]+)\}?", lambda g: g[1].translate(_SUPERSCRIPTS), m)
    m = re.sub(r"\\(left|right)\b", "", m)
    m = re.sub(r"\\([A-Za-z]+|.)", lambda g: _TEX_SYMBOLS.get(g[1], g[1]), m)
    return m.replace("{", "").replace("}", "").strip()


def plain_tex(text) -> str:
    """A MATH problem's inline TeX (``$12$``, ``$k$``, ``$\\frac{1}{2}$``, ``\\$1.25``) as plain text for
    a table cell, where the page's MathJax does not typeset it (it printed as raw ``$12$``)."""
    if not isinstance(text, str) or ("$" not in text and "\\" not in text):
        return text

    def sub(g: re.Match) -> str:  # "$1600. The TV costs $600": dollars, not TeX (no TeX in it, and words)
        inner = g[1]
        return _detex(inner) if _TEX_HINT.search(inner) or not re.search(r"\s", inner.strip()) else g[0]

    out = _INLINE.sub(sub, text)
    return out.replace("\\$", "$")


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
