"""Final answers y and the reward 1{y = y*} (Sec. 5.4), and Table 1's "valid answer".

``extract_answer`` finds the final answer of a generation: the last ``#### X``, else the last
"The (final) answer is X", else the last ``\\boxed{X}``. ``verify`` checks it against the gold
answer with math-verify (gold first, with a timeout). ``grade`` returns both flags the tables
need: ``valid`` (an answer was extracted: Succ.) and ``correct`` (it equals the gold: pass@k).
"""
from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

_HASH = re.compile(r"####\s*(.+)")
_ANSWER_IS = re.compile(r"the\s+(?:final\s+)?answer\s+is\s*:?\s*(.+)", re.IGNORECASE)
_UNITS = re.compile(r"\s*(dollars?|cents?|units?|meters?|miles?|hours?|minutes?|days?|years?|people|"
                    r"apples?|eggs?|pounds?|kg|km|cm|m|%)\b\.?$", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched."""
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    j = text.find("{", i)
    if j < 0:
        return None
    depth = 0
    for k in range(j, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1:k].strip()
    return None


def _clean(ans: str) -> str | None:
    ans = ans.strip().splitlines()[0].strip() if ans.strip() else ""
    boxed = last_boxed(ans)
    if boxed is not None:
        ans = boxed
    ans = re.sub(r"[.。]+$", "", ans.strip()).strip().strip("$").strip()
    ans = re.sub(r"[.。]+$", "", ans).strip()
    ans = re.sub(r"^\\\(|\\\)$", "", ans).strip()
    return ans or None


def extract_answer(text: str) -> str | None:
    """The final answer of a generation, or None when it states none."""
    if not text:
        return None
    m = _HASH.findall(text)
    if m:
        return _clean(m[-1])
    m = _ANSWER_IS.findall(text)
    if m:
        return _clean(m[-1])
    boxed = last_boxed(text)
    return _clean(boxed) if boxed is not None else None


def normalize(ans: str) -> str:
    """A canonical string for the exact-match fast path and for math-verify's input."""
    s = ans.strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\!", "").replace("\\,", "")
    s = re.sub(r"^(?:x|y|n|k|a)\s*=\s*", "", s)  # "x = 5" -> "5"
    s = _UNITS.sub("", s).strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):  # thousands separators, not tuples
        s = s.replace(",", "")
    s = re.sub(r"(\d)\.0+$", r"\1", s)  # 18.00 -> 18
    return s.strip()


def _verify_math(gold: str, pred: str, timeout_s: float) -> bool:
    from math_verify import parse, verify as mv_verify

    in_main = threading.current_thread() is threading.main_thread()
    t = int(max(1, timeout_s)) if in_main else None  # signal-based timeouts need the main thread

    def p(s: str):
        return parse(s if "$" in s else f"${s}$", parsing_timeout=t)

    g, q = p(gold), p(pred)
    if not g or not q:
        return False
    return bool(mv_verify(g, q, timeout_seconds=t))


def verify(gold: str, pred: str, timeout_s: float = 5.0) -> bool:
    """Whether ``pred`` equals ``gold`` (math-verify; gold first; exact match as a fast path)."""
    if pred is None:
        return False
    g, q = normalize(gold), normalize(pred)
    if g == q:
        return True
    try:
        return _verify_math(g, q, timeout_s)
    except Exception as e:  # math-verify raises on pathological inputs or timeouts: count as wrong
        log.debug("math-verify failed on gold=%r pred=%r: %s", gold, pred, e)
        return False


@dataclass(frozen=True)
class Grade:
    valid: bool  # an answer could be extracted (Succ.)
    correct: bool  # it equals the gold answer (reward, pass@k)
    pred: str | None


def grade(text: str, gold: str) -> Grade:
    pred = extract_answer(text)
    return Grade(valid=pred is not None, correct=pred is not None and verify(gold, pred), pred=pred)


def reference_verify_report(dataset: str, split: str = "test", data_dir: str | None = None) -> dict:
    """How many reference solutions verify against their own gold answer (a check of the data
    loader and of the answer checker). GSM8K solutions end in ``#### N``; MATH solutions in
    ``\\boxed{}``."""
    from ctrls.data import load_problems, raw_solutions

    problems = load_problems(dataset, split, data_dir=data_dir)
    sols = raw_solutions(dataset, split, data_dir=data_dir)
    failures = []
    for p in problems:
        g = grade(sols[p.id], p.answer)
        if not g.correct:
            failures.append({"id": p.id, "gold": p.answer, "extracted": g.pred})
    n = len(problems)
    return {"dataset": dataset, "split": split, "n": n, "rate": (n - len(failures)) / n, "failures": failures}
