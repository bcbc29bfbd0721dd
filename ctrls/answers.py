"""Final answers y, the reward 1{y = y*} (Sec. 5.4, Eq. 14), and Table 1's "valid answer" (Succ.).

The answer policy of this project (also on the book's method page, "Answer checking"):

1. **The last answer marker wins.** A final answer is stated by ``#### X``, by "The answer is X"
   (or "The final answer is X"; any case, an optional colon) or by ``\\boxed{X}`` (or
   ``\\fbox{X}``; braces matched). Whatever their kinds, the marker that comes last in the text
   gives the answer. After ``####`` and "the answer is", X is the rest of the line up to the first
   sentence end outside math, with ``**``, ``$`` signs, ``\\(...\\)`` and a final period removed.
   A marker with nothing readable after it (a trailing ``####``, "The answer is.", an empty or
   unclosed ``\\boxed{``) is passed over for the marker before it. A text with no marker has no
   answer: it is not valid (Table 1's Succ.) and never correct.
2. **Units, percent and currency symbols are ignored.** Both the extracted answer and the gold
   go through :func:`normalize`, which
   - drops currency symbols anywhere: ``$``, ``\\$``, ``€``, ``£``, ``¥``, ``₹`` and the macros
     ``\\euro``, ``\\texteuro``, ``\\pounds``, ``\\textsterling``, ``\\yen``, ``\\textyen``,
     ``\\textdollar``;
   - drops percent signs (``%``, ``\\%``): 50% equals 50 (and not 0.5);
   - drops degree marks (``°``, ``^\\circ``, ``^{\\circ}``, ``\\degree``);
   - after a number, drops one unit of ``UNITS`` (any case), optionally after "square", "cubic"
     or "sq", with an optional power ``^2``, ``^3``, ``^{2}``, ``²``, ``³`` and an optional
     ``/unit`` or "per unit" ("12 cm^2", "3kg", "60 km/h", "5 sq ft"). The one-letter units of
     ``SHORT_UNITS`` (m, g, s, h, L) count only after a space or a slash ("5 m", "5 g/s"): "5m"
     may be 5 times m, and is left to math-verify;
   - after a number, drops any trailing words without digits or math ("18 dollars", "12 cookies
     per box"), unless a word makes it an expression (and, or, to, plus, minus, times, by, over,
     divided, than, of, pi, sqrt, or a single letter that is not a unit: "2 and 3", "3 pi", "5 x");
   - drops a parenthetical with words after a number ("42 (6 times 7)", not "5 (x+1)").
   It also unwraps ``\\text{}``, ``\\textbf{}``, ``\\textrm{}``, ``\\mathrm{}`` and ``\\mbox{}``,
   reads "−" as "-", and removes LaTeX spacing, a final period, a leading ``x =``, thousands
   separators (``1,000`` and ``12,345.5``, not the tuple ``(1,2)`` or ``1,0000``) and trailing
   zero decimals (``18.00``).
3. **math-verify decides equality.** Two normalised strings that are identical are equal;
   otherwise ``math_verify.parse``/``verify`` compares them (gold first, with a timeout), so
   ``1/2`` equals ``0.5`` and ``x^2+1`` equals ``1+x^2``. A math-verify timeout or error counts as
   not equal (and is logged).

``extract_answer`` applies rule 1, ``verify`` rules 2 and 3, and ``grade`` returns both flags the
tables need: ``valid`` (an answer was extracted, Succ.) and ``correct`` (it equals the gold, the
reward and pass@k).
"""
from __future__ import annotations

import logging
import math
import re
import threading
from dataclasses import dataclass

from ctrls.data import boxed_at, last_boxed, load_problems  # last_boxed: MATH's answer format, kept importable here

log = logging.getLogger(__name__)

# Rule 1: every answer marker; the last one with a readable answer wins
_MARKER = re.compile(r"####|(?i:the\s+(?:final\s+)?answer\s+is\s*:?)|\\boxed|\\fbox")

# Rule 2: the units dropped after a number (any case), and the one-letter ones (after a space or a slash only)
UNITS = (
    "mm", "cm", "km", "meters", "meter", "metres", "metre", "centimeters", "centimeter", "centimetres",
    "centimetre", "millimeters", "millimeter", "kilometers", "kilometer", "inches", "inch", "in", "feet", "foot",
    "ft", "yards", "yard", "yd", "miles", "mile", "mi",
    "mg", "kg", "grams", "gram", "kilograms", "kilogram", "lbs", "lb", "pounds", "pound", "ounces", "ounce", "oz",
    "tons", "ton", "tonnes", "tonne",
    "ml", "liters", "liter", "litres", "litre", "gallons", "gallon", "gal",
    "seconds", "second", "secs", "sec", "minutes", "minute", "mins", "min", "hours", "hour", "hrs", "hr", "days",
    "day", "weeks", "week", "months", "month", "years", "year", "yrs", "yr",
    "mph", "kph", "km/h", "m/s",
    "dollars", "dollar", "cents", "cent", "euros", "euro", "yen", "usd", "eur", "gbp", "jpy",
    "percent", "per cent", "degrees", "degree",
)
SHORT_UNITS = ("m", "g", "s", "h", "L")

_NUMBER = r"[-+]?(?:\d[\d,]*)?\.?\d+"
_UNIT = (r"(?:(?i:square|cubic|sq\.?)\s*)?"
         rf"(?:(?i:{'|'.join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))})"
         rf"|(?<=[\s/])(?:{'|'.join(SHORT_UNITS)}))(?![A-Za-z])"
         r"(?:\^\{?[23]\}?|[²³])?")
_NUMBER_UNIT = re.compile(rf"({_NUMBER})\s*{_UNIT}(?:\s*(?:/|(?i:per))\s*{_UNIT})?\.?")
_CURRENCY = re.compile(r"\\\$|\$|€|£|¥|₹|\\(?:euro|texteuro|pounds|textsterling|yen|textyen|textdollar)(?![A-Za-z])"
                       r"(?:\{\})?")
_PERCENT = re.compile(r"\\?%")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|°|\\degree(?![A-Za-z])")
# a number followed by words without digits or math (units, nouns): "18 dollars", "12 cookies per box"
_NUMBER_WORDS = re.compile(rf"({_NUMBER})\s*[A-Za-z][A-Za-z'\- ]*\.?")
_NUMBER_PAREN = re.compile(rf"({_NUMBER})\s+\((?=[^()]*[A-Za-z]{{2}})[^()]*\)")  # "42 (6 times 7)", not "5 (x+1)"
# words that make "N word" an expression, not a number with a unit: "2 and 3", "3 pi", "5x"
_NOT_UNITS = re.compile(r"\b(?:and|or|to|plus|minus|times|by|over|divided|than|of|pi|sqrt|[a-z])\b", re.IGNORECASE)
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")  # 1,000 but not (1,2) or 1,0000
_VAR_EQ = re.compile(r"^[A-Za-z]\s*=\s*(?=[^=]+$)")  # "x = 5" -> "5"
_TEXT = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\{([^{}]*)\}")


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
    ``$``, ``**`` or final period; None when nothing is left."""
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


def extract_answer(text: str) -> str | None:
    """The final answer of a generation (policy rule 1), or None when it states none.

    The last marker (``#### X``, "The (final) answer is X", ``\\boxed{X}``) wins whatever its kind;
    one with nothing readable after it is passed over for the one before. Only the first line and
    sentence after ``####`` or "the answer is" is read. The answer is returned as written (before
    :func:`normalize`).
    """
    if not text:
        return None
    for m in reversed(list(_MARKER.finditer(text))):
        if m.group().startswith("\\"):
            boxed = boxed_at(text, m.start())
            ans = None if boxed is None else _clean(boxed)
        else:
            ans = _clean(text[m.end():])
        if ans is not None:
            return ans
    return None


def normalize(ans: str) -> str:
    """A canonical string for the exact-match fast path and for math-verify's input (policy rule 2:
    units, percent, currency and degree symbols dropped; see the module docstring for the list)."""
    s = ans.strip().replace("\u2212", "-")
    for _ in range(2):  # \textbf{\text{12}}
        s = _TEXT.sub(r"\1", s)
    s = _CURRENCY.sub("", s)
    s = _PERCENT.sub("", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\!", "").replace("\\,", "").replace("{,}", ",")
    s = re.sub(r"(?<!\\)\\[;: ]|~", " ", s).strip()  # not the "\\ " of a matrix row end
    s = re.sub(r"(?<!\.)\.$", "", s)  # one final period ("i." in a gold), not an ellipsis
    s = _VAR_EQ.sub("", s.strip()).strip()
    unit, words, paren = _NUMBER_UNIT.fullmatch(s), _NUMBER_WORDS.fullmatch(s), _NUMBER_PAREN.fullmatch(s)
    if unit:
        s = unit.group(1)
    elif words and not _NOT_UNITS.search(s[words.end(1):]):
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
    """Whether ``pred`` equals ``gold`` (policy rules 2 and 3): exact match after :func:`normalize`,
    else math-verify on the normalised strings.

    A prediction that normalises to nothing ("%", "€") is not equal to anything; a gold that does is
    an error. A math-verify timeout or internal error counts as not equal (and is logged).
    """
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"verify needs a non-empty gold answer, got {gold!r}")
    g = normalize(gold)
    if not g:
        raise ValueError(f"the gold answer {gold!r} is empty once units, percent and currency symbols are dropped")
    if pred is None or not pred.strip():
        return False
    q = normalize(pred)
    if not q:
        return False
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
    problems = load_problems(dataset, split, data_dir=data_dir)
    failures = []
    for p in problems:
        g = grade(p.meta["solution"], p.answer)
        if not g.correct:
            failures.append({"id": p.id, "gold": p.answer, "extracted": g.pred})
    n = len(problems)
    return {"dataset": dataset, "split": split, "n": n, "rate": (n - len(failures)) / n, "failures": failures}
