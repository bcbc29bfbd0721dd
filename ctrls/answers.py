"""Final answers y, the reward 1{y = y*} (Sec. 5.4, Eq. 14), and Table 1's "valid answer" (Succ.).

``extract_answer`` finds the final answer of a generation: the last ``#### X``, else the last
"The (final) answer is X", else the content of the last ``\\boxed{X}``. ``verify`` checks it
against the gold answer: an exact match after normalisation, else math-verify (gold first, with a
timeout). ``grade`` returns both flags the tables need: ``valid`` (an answer was extracted, Succ.)
and ``correct`` (it equals the gold, the reward and pass@k).
"""
from __future__ import annotations

import logging
import math
import re
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

_HASH = re.compile(r"####")
_ANSWER_IS = re.compile(r"the\s+(?:final\s+)?answer\s+is\s*:?", re.IGNORECASE)
_NUMBER = r"[-+]?(?:\d[\d,]*)?\.?\d+"
# a number followed by words without digits or math (units, nouns): "18 dollars", "12 cookies per box"
_NUMBER_WORDS = re.compile(rf"({_NUMBER})\s*[A-Za-z][A-Za-z'\- ]*\.?")
_NUMBER_PAREN = re.compile(rf"({_NUMBER})\s+\((?=[^()]*[A-Za-z]{{2}})[^()]*\)")  # "42 (6 times 7)", not "5 (x+1)"
# words that make "N word" an expression, not a number with a unit: "2 and 3", "3 pi", "5x"
_NOT_UNITS = re.compile(r"\b(?:and|or|to|plus|minus|times|by|over|divided|than|of|pi|sqrt|[a-z])\b", re.IGNORECASE)
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")  # 1,000 but not (1,2) or 1,0000
_VAR_EQ = re.compile(r"^[A-Za-z]\s*=\s*(?=[^=]+$)")  # "x = 5" -> "5"


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched; None if unclosed."""
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


def _first_sentence(s: str) -> str:
    """``s`` up to its first sentence end (``.`` then whitespace) outside ``$...$`` and braces."""
    in_math, depth = False, 0
    for i, ch in enumerate(s):
        if ch == "$" and (i == 0 or s[i - 1] != "\\"):
            in_math = not in_math
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "." and not in_math and depth <= 0 and i + 1 < len(s) and s[i + 1].isspace():
            return s[:i]
    return s


def _clean(ans: str) -> str | None:
    """The answer in the text after a marker: its first line and sentence, boxed content, no
    ``$``, ``**`` or final period."""
    ans = ans.strip().split("\n")[0]
    ans = _first_sentence(ans).strip()
    boxed = last_boxed(ans)
    if boxed is not None:
        ans = boxed
    ans = ans.replace("**", "").strip()
    for _ in range(2):  # "$12$." -> "12"
        ans = re.sub(r"[.。]+$", "", ans).strip()
        if ans.startswith("\\(") and ans.endswith("\\)"):
            ans = ans[2:-2]
        ans = re.sub(r"^\$+|(?<!\\)\$+$", "", ans).strip()
    return ans or None


def _after_last(pattern: re.Pattern, text: str) -> tuple[int, str | None]:
    """(position, cleaned answer) after the last match of ``pattern``; (-1, None) if none."""
    matches = list(pattern.finditer(text))
    if not matches:
        return -1, None
    return matches[-1].start(), _clean(text[matches[-1].end():])


def extract_answer(text: str) -> str | None:
    """The final answer of a generation, or None when it states none.

    The last ``#### X`` wins; else the last "The (final) answer is X" (case-insensitive; a
    trailing period, ``$`` signs and a ``\\boxed{}`` wrapper are removed) or the content of the
    last ``\\boxed{...}`` (braces matched), whichever comes later in the text (so "we might say
    the answer is 18. However ... \\boxed{9}" gives 9). Only the first line and sentence after a
    marker is read.
    """
    if not text:
        return None
    _, ans = _after_last(_HASH, text)
    if ans is not None:
        return ans
    at, ans = _after_last(_ANSWER_IS, text)
    boxed_at = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    boxed = last_boxed(text)
    if boxed is not None and (ans is None or boxed_at > at):
        return _clean(boxed) or ans
    return ans


def normalize(ans: str) -> str:
    """A canonical string for the exact-match fast path and for math-verify's input.

    Removes ``\\text{}`` wrappers, ``$`` and LaTeX spacing, a final period, a leading ``x =``, trailing unit words
    after a number ("18 dollars") and a parenthetical after a number, thousands separators
    (``1,000``; tuples like ``(1,2)`` are left alone) and trailing zero decimals (``18.00``).
    """
    s = ans.strip()
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\!", "").replace("\\,", "").replace("{,}", ",")
    s = re.sub(r"(?<!\.)\.$", "", s.strip())  # one final period ("i." in a gold), not an ellipsis
    s = _VAR_EQ.sub("", s.strip()).strip()
    words, paren = _NUMBER_WORDS.fullmatch(s), _NUMBER_PAREN.fullmatch(s)
    if words and not _NOT_UNITS.search(s[words.end(1):]):
        s = words.group(1)
    elif paren:
        s = paren.group(1)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = re.sub(r"^([-+]?\d+)\.0+$", r"\1", s)  # 18.00 -> 18
    return s.strip()


def _math_verify(gold: str, pred: str, timeout_s: float) -> bool:
    from math_verify import parse, verify as mv_verify

    # math-verify's timeouts use SIGALRM, which only the main thread may set: elsewhere run without
    t = max(1, math.ceil(timeout_s)) if threading.current_thread() is threading.main_thread() else None

    def p(s: str):
        return parse(s if "$" in s or "\\(" in s else f"${s}$", parsing_timeout=t)

    g, q = p(gold), p(pred)
    if not g or not q:
        return False
    return bool(mv_verify(g, q, timeout_seconds=t))  # gold first: math-verify is not symmetric


def verify(gold: str, pred: str | None, timeout_s: float = 5.0) -> bool:
    """Whether ``pred`` equals ``gold``: exact match after :func:`normalize`, else math-verify.

    A math-verify timeout or internal error counts as not equal (and is logged).
    """
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"verify needs a non-empty gold answer, got {gold!r}")
    if pred is None or not pred.strip():
        return False
    g, q = normalize(gold), normalize(pred)
    if g == q:
        return True
    try:
        return _math_verify(g, q, timeout_s)
    except Exception as e:  # pathological input: count as wrong, but say so
        log.warning("math-verify failed on gold=%r pred=%r (counted as wrong): %s", gold, pred, e)
        return False


@dataclass(frozen=True)
class Grade:
    valid: bool  # an answer could be extracted (Succ.)
    correct: bool  # it equals the gold answer (reward, pass@k)
    pred: str | None


def grade(text: str, gold: str) -> Grade:
    """Extract the final answer of ``text`` and check it against ``gold``."""
    pred = extract_answer(text)
    return Grade(valid=pred is not None, correct=pred is not None and verify(gold, pred), pred=pred)


def reference_verify_report(dataset: str, split: str = "test", data_dir: str | None = None) -> dict:
    """Grade every reference solution of a split against its own gold answer.

    A check of the data loader and of the answer checker together: GSM8K solutions end in
    ``#### N``, MATH solutions in ``\\boxed{}``. Returns ``{dataset, split, n, rate, failures}``
    with one ``{id, gold, extracted}`` per failure.
    """
    from ctrls.data import load_problems

    problems = load_problems(dataset, split, data_dir=data_dir)
    failures = []
    for p in problems:
        g = grade(p.meta["solution"], p.answer)
        if not g.correct:
            failures.append({"id": p.id, "gold": p.answer, "extracted": g.pred})
    n = len(problems)
    return {"dataset": dataset, "split": split, "n": n, "rate": (n - len(failures)) / n, "failures": failures}
