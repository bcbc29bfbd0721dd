"""Case studies (Sec. 6.4 and App. D, Figures 3, 6 and 7): Base vs CTRLS step traces with each step's latent state.

Cases are chosen per backbone (each backbone's Base against its own CTRLS). The selection rule is
code, never a hand pick (``select_cases``). A case shows what CTRLS adds, so its CTRLS side is a sample
of a row that draws state transitions (CTRLS(ε), never the fixed-s0 ablation, which holds one state)
whose drawn state changes at least once along its steps. For each backbone and temperature the rule
takes questions on which no Base sample is correct and such a sample is, in question-id order. For
each, that sample (lowest epsilon, then lowest sample index) is shown beside the first Base sample
with a valid answer (else Base sample 0). When no question qualifies, the rule relaxes one step at a
time, and the page says which rule it applied: first a correct CTRLS(ε) sample whose state stays put,
then questions where a CTRLS(ε) row has more correct samples than Base.
"""
from __future__ import annotations

import html
import math
import re

import pandas as pd

from ctrls.config.settings import BASE, FIXED
from ctrls.data.answers import normalize


def _first(g: pd.DataFrame) -> pd.Series:
    return g.sort_values(["_eps", "sample_index"]).iloc[0]


def state_changes(states) -> bool:
    """Whether a sample's drawn states change at least once along its steps."""
    if states is None or (isinstance(states, float) and math.isnan(states)):
        return False
    return len(set(list(states))) > 1


RULES = (  # (the rule as the page states it, the questions it takes, the CTRLS sample it shows)
    "Base has no correct sample, and a CTRLS(ε) sample whose drawn state changes is correct",
    "no question has that; shown instead: Base has no correct sample, and a CTRLS(ε) sample is correct "
    "(its drawn state does not change)",
    "no question has a wrong Base and a right CTRLS(ε); shown instead: questions where a CTRLS(ε) row has "
    "more correct samples than Base",
)


def select_cases(samples: pd.DataFrame, n: int = 3, backbone: str | None = None) -> tuple[pd.DataFrame, str]:
    """Pairs (Base, CTRLS) of one backbone by the module's rule; returns them and the rule that was
    applied. ``backbone`` may be omitted only when the samples hold one backbone."""
    names = list(dict.fromkeys(samples.backbone)) if "backbone" in samples else []
    if backbone is None:
        if len(names) > 1:
            raise ValueError(f"samples of {len(names)} backbones {names}: case studies are per backbone, pass backbone=")
    else:
        if backbone not in names:
            raise ValueError(f"no samples of backbone {backbone!r}; the samples have {names}")
        samples = samples[samples.backbone == backbone]
    df = samples.assign(_eps=samples.epsilon.fillna(-1.0),
                        _moves=samples.states.map(state_changes) if "states" in samples else False)
    df = df[df.config != FIXED]  # one state held: no transition to show
    per_q = df.groupby(["temperature", "question_id", "config"]).correct.sum().unstack("config", fill_value=0)
    ctrls_cols = [c for c in per_q.columns if c != BASE]
    if BASE not in per_q or not ctrls_cols:
        return pd.DataFrame(), "no Base and CTRLS(ε) samples to compare"
    moving = df[(df.config != BASE) & df.correct & df._moves].groupby(["temperature", "question_id"]).size()
    moving = moving.reindex(per_q.index, fill_value=0)
    best = per_q[ctrls_cols].max(axis=1)
    wrong_base = per_q[BASE] == 0
    for rule, chosen in zip(RULES, (per_q[wrong_base & (moving > 0)], per_q[wrong_base & (best > 0)],
                                    per_q[best > per_q[BASE]])):
        if not chosen.empty:
            break
    else:
        return pd.DataFrame(), ("no case found: on no question does CTRLS(ε) answer right where Base is always "
                                "wrong, nor have more correct samples than Base")
    pairs = []
    for (eta, qid) in sorted(chosen.index, key=lambda k: (k[1], k[0]))[:n]:
        g = df[(df.temperature == eta) & (df.question_id == qid)]
        c = g[g.config != BASE]
        for pick in (c[c.correct & c._moves], c[c.correct], c[c._moves], c):
            if len(pick):
                c = _first(pick)
                break
        b = g[g.config == BASE]
        b = _first(b[b.valid]) if b.valid.any() else _first(b)
        pairs.append({"temperature": eta, "question_id": qid, "base": b, "ctrls": c})
    return pd.DataFrame(pairs), rule


_TEX_INLINE = re.compile(r"\$([^$\n]+?)\$")
_TEX_HINT = re.compile(r"[\\^_{}]|[a-zA-Z]\s*[=<>+\-*/]|[=<>+\-*/]\s*[a-zA-Z(]|^\s*[a-zA-Z]\s*$")

STATE_NOTE = ("<b>s = j</b> on a step: the latent state (one of the K states, numbered from 0) under which "
              "CTRLS generated that step, the most likely state of the distribution drawn for it; Base "
              "generates without states, so its steps carry a label only where the exploration stage "
              "encoded them.")


def state_note_html() -> str:
    """The ``s = j`` legend of the traces, once."""
    return f"<p style='font-size:0.85em;margin:4px 0 12px'>{STATE_NOTE}</p>"


def tex_html(text: str) -> str:
    """``text`` escaped for HTML, with each ``$...$`` that reads as TeX (a backslash, ``^``, ``_``,
    braces, an operator beside a letter, or a lone letter such as ``$x$``) turned into MathJax's ``\\(...\\)``; a
    dollar amount such as "$5 and $10" stays as it is."""
    def sub(m: re.Match) -> str:
        inner = m.group(1)
        return f"\\({inner}\\)" if _TEX_HINT.search(inner) else m.group(0)
    return html.escape(_TEX_INLINE.sub(sub, str(text)), quote=False)


def shown_answer(row: pd.Series) -> str:
    """The answer a trace shows: the normalised extracted answer, or "no answer"."""
    pred = row.get("pred")
    if pred is None or (isinstance(pred, float) and math.isnan(pred)) or not str(pred).strip():
        return "no answer"
    return normalize(str(pred)) or "no answer"


def trace_html(question: str, gold: str, left: pd.Series, right: pd.Series, left_title: str = "Base",
               right_title: str = "CTRLS", note: bool = True) -> str:
    """Side-by-side step traces, each step with its latent state, laid out like Figures 3, 6 and 7. The
    steps are the model's own lines, in order (not renumbered); ``$...$`` TeX is typeset. ``note``: the
    ``s = j`` legend under the traces (a page of several cases shows it once, :func:`state_note_html`)."""
    def column(row: pd.Series, title: str) -> str:
        states = list(row.get("states", []) if isinstance(row.get("states"), (list, tuple)) else
                      (row.get("states").tolist() if row.get("states") is not None else []))
        items = []
        for i, step in enumerate(row.steps):
            badge = (f"<span style='background:#e6eefc;border-radius:3px;padding:0 4px;margin-right:4px;"
                     f"font-size:0.8em' title='latent state of this step'>s = {states[i]}</span>") if i < len(states) else ""
            items.append(f"<li style='margin:2px 0'>{badge}{tex_html(step)}</li>")
        verdict = "✓ final answer correct" if row.correct else ("✗ final answer wrong" if row.valid else "✗ no answer")
        color = "#1a7f37" if row.correct else "#cf222e"
        label = title if title != "CTRLS" else f"CTRLS ({row.config})"
        return (f"<div style='flex:1;border:1px solid #ccc;border-radius:6px;padding:6px 10px;min-width:0'>"
                f"<b>{html.escape(label)}</b> · answer <code>{html.escape(shown_answer(row))}</code> "
                f"<span style='color:{color}'>{verdict}</span>"
                f"<ul style='list-style:none;padding-left:0'>{''.join(items)}</ul></div>")
    head = (f"<div style='border:2px solid #3b6fd1;border-radius:6px;background:#f3f6fd;padding:6px 10px;margin-bottom:6px'>"
            f"<b>Question</b>: {tex_html(question)}<br><b>Gold</b>: {tex_html(gold)}</div>")
    note = state_note_html() if note else ""
    return (f"<div class='ctrls-case mathjax_process tex2jax_process'>{head}"
            f"<div style='display:flex;gap:10px'>{column(left, left_title)}{column(right, right_title)}</div>{note}</div>")


def best_sample(samples: pd.DataFrame) -> pd.Series:
    """The sample a case study shows of one side: a correct one if any, else a valid one, then the
    lowest sample index (deterministic)."""
    return samples.sort_values(["correct", "valid", "sample_index"], ascending=[False, False, True]).iloc[0]
