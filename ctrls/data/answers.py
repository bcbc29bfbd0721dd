"""Final answers y, the reward 1{y = y*} (Sec. 5.4, Eq. 12), and Table 1's "valid answer" (Succ.).

The answer policy in short (every rule and case: book/method.md, "Answer checking"):

1. The last marker (``#### X``, "The (final) answer is X", ``\\boxed{X}``) wins; one with nothing
   readable, or not answer-like after an answer-like one, is passed over; no marker, no answer.
2. :func:`normalize` drops currency, percent and degree signs, a unit of ``UNITS`` (``SHORT_UNITS`` only
   after a space or a slash), trailing words and thousands separators; words that change a number's
   value ("5 thousand", "2 dozen", "5 squared") scale it or are refused, never dropped.
3. Identical strings, and plain decimals equal as written, are equal; otherwise math-verify decides.
4. Bounded work: the last ``MAX_TEXT_CHARS`` characters, ``MAX_MARKERS`` markers, ``MAX_ANSWER_CHARS``.
``extract_answer`` applies rule 1, ``verify`` rules 2 and 3, ``grade`` gives ``valid`` (Succ.) and
``correct`` (the reward, pass@k); a gold must pass :func:`gold_problem`.
"""
from __future__ import annotations

import functools
import logging
import math
import re
import threading
import unicodedata
from dataclasses import dataclass
from decimal import Context, Decimal, DecimalException, Inexact, InvalidOperation, Overflow, localcontext
from fractions import Fraction

log = logging.getLogger(__name__)

# Bounds (rule 4): the work per text is linear in its length, whatever the text
MAX_TEXT_CHARS = 100_000  # extract_answer reads the last this many characters (the answer is at the end)
MAX_ANSWER_CHARS = 1_000  # an answer longer than this (after a marker, in a box) is no answer
MAX_MARKERS = 64  # markers examined, from the last
MAX_VERIFY_CHARS = 300  # a prediction longer than this (normalised) is not handed to math-verify: not equal

_BOXED = re.compile(r"\\boxed|\\fbox")


def boxed_at(text: str, i: int, limit: int | None = None) -> str | None:
    """The content of the ``\\boxed{...}`` or ``\\fbox{...}`` that starts at ``text[i]``, braces
    matched; None when no brace follows the command (spaces aside), it is not closed, or (with
    ``limit``) it is not closed within ``limit`` characters (so that many unclosed boxes cost
    linear time)."""
    m = _BOXED.match(text, i)
    if m is None:
        return None
    j = m.end()
    while j < len(text) and text[j].isspace():
        j += 1
    if j == len(text) or text[j] != "{":
        return None
    depth = 0
    for k in range(j, len(text) if limit is None else min(len(text), j + limit + 2)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1:k].strip()
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched; None if there is
    none or it is unclosed. MATH solutions state their answer this way."""
    starts = [m.start() for m in _BOXED.finditer(text)]
    return boxed_at(text, starts[-1], MAX_ANSWER_CHARS) if starts else None


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

_NUMBER = r"[-+]?(?:\d(?:[\d,]*\d)?(?:\.\d+)?|\.\d+)"  # one way to split any digits: linear backtracking
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
# "42 (6 times 7)", not "5 (x+1)", and not a hedge: "12 (or maybe 15)"
_HEDGE = r"\b(?:or|maybe|perhaps|possibly|probably|either|alternatively|otherwise)\b"
_NUMBER_PAREN = re.compile(rf"({_NUMBER})\s+\((?=[^()]*[A-Za-z]{{2}})(?![^()]*{_HEDGE})[^()]*\)", re.IGNORECASE)
# words after a number that change its value: scaled (magnitudes, powers, factorial) or refused, never dropped
MAGNITUDES = {"hundred": 100, "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12, "dozen": 12}
_SCALED = re.compile(rf"({_NUMBER})\s*({'|'.join(MAGNITUDES)}|squared|cubed|factorial)s?\b(.*)", re.IGNORECASE | re.DOTALL)
_VALUE_WORDS = re.compile(rf"\b(?:{'|'.join(MAGNITUDES)})s?\b|\b(?:squared|cubed|factorial|halves|thirds?|"
                          rf"(?:ten|hundred|thousand|million)ths?)\b|{_HEDGE}", re.IGNORECASE)
_SCIENTIFIC = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)[eE][-+]?\d{1,3}")  # 1e-05, 2.5E+16
# what an answer looks like (rule 1): a number, math, a LaTeX command, or one letter ("C", "(b)", "x")
_ANSWER_LIKE = re.compile(r"[-+]?\s*(?:\.?\d|[\\([{$])|\(?[A-Za-z]\)?$|.*[=^_+*<>]", re.DOTALL)  # a sign before LaTeX too
# words that make "N word" an expression, not a number with a unit: "2 and 3", "3 pi", "5x"
_NOT_UNITS = re.compile(r"\b(?:and|or|to|plus|minus|times|by|over|divided|than|of|pi|sqrt|[a-z])\b", re.IGNORECASE)
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")  # 1,000 but not (1,2) or 1,0000
_VAR_EQ = re.compile(r"^[A-Za-z]\s*=\s*(?=[^=]+$)")  # "x = 5" -> "5"
_TEXT = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\{([^{}]*)\}")
# a LaTeX fraction followed by words ("\frac{1}{2} cup", "\frac12 cup", after \text{} is unwrapped): the words
# are a unit; an argument is a group (one level of nesting: "\frac{\sqrt{3}}{2}") or one digit or letter
_FRAC_ARG = r"(?:\{(?:[^{}]|\{[^{}]*\})*\}|\s*[0-9A-Za-z])"
_FRAC_WORDS = re.compile(rf"([-+]?\s*\\[dt]?frac{_FRAC_ARG}{_FRAC_ARG})\s+([A-Za-z][A-Za-z'\- ]*)\.?")
# "15, not 12" or "15 apples, not 12": the answer is the number (and its unit, dropped later) before the "not"
_NOT_OTHER = re.compile(rf"({_NUMBER}(?:\s+(?!(?:and|but|not)\b)[A-Za-z][A-Za-z'\-]*){{0,3}})\s*,?\s+(?:and\s+|but\s+)?"
                        r"not\s+\S.*", re.IGNORECASE)
# an en-dash between two numbers is a range ("3–5"); anywhere else it is a minus sign ("–5", "x – 1")
EN_DASH = "\u2013"
_RANGE = re.compile(rf"(?<=\d)\s*{EN_DASH}\s*(?=[-+]?\.?\d)")
# digits grouped by threes with a space (or a no-break, thin or narrow no-break space): "12 345", "1 000 000.5"
_SPACE_GROUPS = re.compile(r"^([-+]?\d{1,3}(?:[ \u00a0\u2009\u202f]\d{3})+(?:\.\d+)?)(?![\d.,]|[ \u00a0\u2009\u202f]\d)")
_DECIMAL = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")  # a plain decimal number, after normalize
LOST = "\ufffd"  # what a lone surrogate (or a character lost in decoding) is read as
_SURROGATE = re.compile("[\ud800-\udfff]")
# Scaled numbers are computed exactly or not at all: Decimal's default context rounds to 28 digits ("50
# factorial" came out 3.041409320171337804361260817E+64); here an inexact result is an error (the words stay)
_EXACT = Context(prec=4 * MAX_ANSWER_CHARS, Emax=10 * MAX_ANSWER_CHARS, Emin=-10 * MAX_ANSWER_CHARS,
                 traps=[Inexact, InvalidOperation, Overflow])
# Unicode vulgar fractions (½, ¾, ⅞, ...), alone or after a whole number ("1⅓", "3 ¼"), are the fraction they
# show; U+2044 (the fraction slash of "1⁄2") is a slash
VULGAR = {c: Fraction(unicodedata.numeric(c)).limit_denominator(10) for c in "½⅓⅔¼¾⅕⅖⅗⅘⅙⅚⅐⅛⅜⅝⅞⅑⅒↉"}
_VULGAR = re.compile(rf"(?:(?<!\d)(\d+)[ \u00a0\u2009\u202f]?)?([{''.join(VULGAR)}])")  # whole runs only: linear


def readable_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD: a lone surrogate is no character (it
    cannot be written to a UTF-8 file), so it is read as a character lost in decoding."""
    return _SURROGATE.sub(LOST, text)


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
    ``$``, ``**`` or final period; None when nothing is left, or more than ``MAX_ANSWER_CHARS``."""
    ans = ans.lstrip()[:MAX_ANSWER_CHARS + 1].split("\n")[0].strip()
    if len(ans) > MAX_ANSWER_CHARS:
        return None
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


def answer_like(ans: str) -> bool:
    """Whether an extracted answer looks like one (rule 1): after :func:`normalize` it starts with
    a number, a sign, a bracket or a LaTeX command, holds an operator (``= ^ _ + * < >``), or is a
    single letter. "correct", "rounded" and "rounded to 2 places" do not."""
    n = normalize(ans)
    return bool(n) and _ANSWER_LIKE.match(n) is not None


def extract_answer(text: str) -> str | None:
    """The final answer of a generation (policy rule 1), or None when it states none.

    The last marker (``#### X``, "The (final) answer is X", ``\\boxed{X}``) wins whatever its kind;
    one with nothing readable after it is passed over for the one before, and so is one whose text
    is not answer-like (:func:`answer_like`: "Note: the answer is rounded.") when an earlier marker
    gives an answer-like one. Only the first line and sentence after ``####`` or "the answer is" is
    read. The answer is returned as written (before :func:`normalize`). Bounded work: the last
    ``MAX_TEXT_CHARS`` characters, the last ``MAX_MARKERS`` markers, answers of at most
    ``MAX_ANSWER_CHARS``.
    """
    if not text:
        return None
    text = readable_text(text[-MAX_TEXT_CHARS:])
    fallback = None  # the last readable answer, used when no marker's answer is answer-like
    after = len(text)  # where the next marker starts: the text after a marker ends there ("#### 42 ####")
    for m in reversed(list(_MARKER.finditer(text))[-MAX_MARKERS:]):
        if m.group().startswith("\\"):
            boxed = boxed_at(text, m.start(), MAX_ANSWER_CHARS)
            ans = None if boxed is None else _clean(boxed)
        else:
            ans = _clean(text[m.end():min(after, m.end() + MAX_ANSWER_CHARS + 2)])
        after = m.start()
        if ans is None or LOST in ans:  # nothing readable, or a character of it was lost: no answer
            continue
        if answer_like(ans):
            return ans
        fallback = fallback or ans
    return fallback


def _plain(x: Decimal) -> str:
    """A decimal without exponent or trailing zeros: 1.5E+6 -> "1500000", 0.000010 -> "0.00001"; every
    digit kept (a ``DecimalException`` beyond ``_EXACT``'s precision, never a rounded number)."""
    with localcontext(_EXACT):
        out = format(x.normalize(), "f")
    return out.rstrip("0").rstrip(".") if "." in out else out


def _vulgar(s: str) -> str:
    """"½" -> "1/2", "1⅓" -> "4/3", "-3 ¼" -> "-13/4": a vulgar fraction (after a whole number: a mixed
    number) as the fraction it shows; parenthesised inside a longer expression ("x^(1/2)")."""
    s = s.replace("\u2044", "/")
    if not _VULGAR.search(s):
        return s

    def frac(m: re.Match) -> str:
        f = int(m.group(1) or 0) + VULGAR[m.group(2)]
        return f"({f.numerator}/{f.denominator})" if f.denominator != 1 else f"({f.numerator})"

    out = _VULGAR.sub(frac, s)
    return re.sub(r"^([-+]?)\((\d+(?:/\d+)?)\)(?=\s|$)", r"\1\2", out)  # a leading number needs no brackets


def _scale(s: str) -> str:
    """"5 thousand" -> "5000", "2 dozen eggs" -> "24 eggs", "5 squared" -> "25", "4 factorial" ->
    "24"; unchanged when the number cannot be read or the result would be huge (the words then stay,
    and :func:`verify` refuses them). Exact: every digit of "50 factorial" (``_EXACT``)."""
    try:
        with localcontext(_EXACT):
            return _scale_exact(s)
    except DecimalException:  # more digits than _EXACT holds: not scaled (refused), never rounded
        return s


def _scale_exact(s: str) -> str:
    for _ in range(3):  # "5 hundred thousand"
        m = _SCALED.fullmatch(s)
        if m is None:
            return s
        num, word, rest = m.group(1), m.group(2).lower(), m.group(3)
        if "," in num and not _THOUSANDS.fullmatch(num):
            return s
        try:
            x = Decimal(num.replace(",", ""))
        except InvalidOperation:
            return s
        if word in MAGNITUDES:
            y = x * MAGNITUDES[word]
        elif word == "squared":
            y = x ** 2
        elif word == "cubed":
            y = x ** 3
        elif x == x.to_integral_value() and 0 <= x <= 100:  # factorial
            y = Decimal(math.factorial(int(x)))
        else:
            return s
        s = (_plain(y) + rest).strip()
    return s


def normalize(ans: str) -> str:
    """A canonical string for the exact-match fast path and for math-verify's input (policy rule 2:
    units, percent, currency and degree symbols dropped; see book/method.md for the list)."""
    if len(ans) > MAX_ANSWER_CHARS:  # no answer is this long: returned as is (verify refuses it), in linear time
        return ans.strip()
    s = _vulgar(readable_text(ans.strip()).replace("\u2212", "-"))
    if EN_DASH in s:  # a range keeps its dash ("3 – 5" -> "3–5": no number); any other en-dash is a minus
        s = re.sub(rf"(?<!\d){EN_DASH}|{EN_DASH}(?![-+]?\.?\d)", "-", _RANGE.sub(EN_DASH, s))
    for _ in range(2):  # \textbf{\text{12}}
        s = _TEXT.sub(r"\1", s)
    s = _CURRENCY.sub("", s)
    s = _PERCENT.sub("", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\!", "").replace("\\,", "").replace("{,}", ",")
    s = re.sub(r"(?<!\\)\\[;: ]|~", " ", s).strip()  # not the "\\ " of a matrix row end
    s = _SPACE_GROUPS.sub(lambda m: re.sub(r"\s", "", m.group(1)), s)  # "12 345" -> "12345"
    s = re.sub(r"(?<!\.)\.$", "", s)  # one final period ("i." in a gold), not an ellipsis
    s = _VAR_EQ.sub("", s.strip()).strip()
    s = _scale(s)
    if _SCIENTIFIC.fullmatch(s):
        try:
            s = _plain(Decimal(s))
        except DecimalException:  # more digits than _EXACT holds: left as written
            pass
    if (other := _NOT_OTHER.fullmatch(s)) is not None:
        s = other.group(1)
    if (frac := _FRAC_WORDS.fullmatch(s)) is not None and not _NOT_UNITS.search(frac.group(2)) \
            and not _VALUE_WORDS.search(frac.group(2)):
        s = frac.group(1)
    unit, words, paren = _NUMBER_UNIT.fullmatch(s), _NUMBER_WORDS.fullmatch(s), _NUMBER_PAREN.fullmatch(s)
    if unit:
        s = unit.group(1)
    elif words and not _NOT_UNITS.search(s[words.end(1):]) and not _VALUE_WORDS.search(s[words.end(1):]):
        s = words.group(1)
    elif paren:
        s = paren.group(1)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = re.sub(r"^([-+]?\d+)\.0+$", r"\1", s)  # 18.00 -> 18
    return s.strip()


def _math_verify(gold: str, pred: str, timeout_s: float) -> bool:
    from math_verify import parse
    from math_verify import verify as mv_verify

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
    if LOST in q:  # a character of it was lost in decoding: no answer
        return False
    if _DECIMAL.fullmatch(g) and _DECIMAL.fullmatch(q):  # two decimals: equal as written, to the last digit
        return Decimal(g) == Decimal(q)
    if EN_DASH in q or EN_DASH in g:  # a range ("3–5") is no number: equal only as the same text
        return False
    if len(q) > MAX_VERIFY_CHARS or _VALUE_WORDS.search(q):
        return False  # too long to be an answer, or words that change the value and were not scaled: refused
    if not _ANSWER_LIKE.match(q):  # prose ("Monday", "no solution"): equal as text, case aside
        return q.casefold() == g.casefold()
    try:
        return _math_verify(g, q, timeout_s)
    except Exception as e:  # pathological input: count as wrong, but say so
        log.warning("math-verify failed on gold=%r pred=%r (counted as wrong): %s", gold, pred, e)
        return False


def math_verify_alone(text: str, gold: str, timeout_s: float = 5.0) -> bool:
    """Whether math-verify on its own finds ``gold`` in ``text`` (its extraction and comparison, none of this
    module's): the independent cross-check of ``ctrls verify-references --math-verify``. A timeout or an internal
    error counts as not found."""
    from math_verify import parse
    from math_verify import verify as mv_verify

    t = max(1, math.ceil(timeout_s)) if threading.current_thread() is threading.main_thread() else None
    try:
        g, q = parse(gold if "$" in gold else f"${gold}$", parsing_timeout=t), parse(text, parsing_timeout=t)
        return bool(g and q and mv_verify(g, q, timeout_seconds=t))
    except Exception as e:
        log.warning("math-verify failed on gold=%r (counted as not found): %s", gold, e)
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


@functools.lru_cache(maxsize=1 << 16)
def gold_problem(gold: str) -> str | None:
    """Why ``gold`` can never be graded correct, or None when it is gradable: it must survive
    :func:`normalize`, and the answer a model gives by writing it (``\\boxed{gold}`` or "The answer
    is gold.") must verify against it. Data loaders refuse (skip and count) a gold that is not.
    Remembered per gold string (a function of the string alone): GSM8K's 8,792 rows hold far fewer
    distinct answers, and each notebook's kernel loads the split afresh."""
    try:
        g = normalize(gold)
    except Exception as e:  # defensive: a gold that breaks the normaliser is not gradable
        return f"the gold answer cannot be normalised ({type(e).__name__})"
    if not g:
        return "the gold answer is empty once units, percent and currency symbols are dropped"
    if _SURROGATE.search(gold) or LOST in gold:
        return "the gold answer holds a lone surrogate or U+FFFD (a character lost in decoding)"
    if "####" in gold:
        return "the gold answer holds the answer marker '####' (the loader did not strip it)"
    if len(g) > MAX_ANSWER_CHARS:
        return f"the gold answer is longer than {MAX_ANSWER_CHARS} characters"
    for written in (f"\\boxed{{{gold}}}", f"The answer is {gold}"):
        pred = extract_answer(written)
        if pred is not None and verify(gold, pred):
            return None
    return "the gold answer does not verify against itself (as \\boxed{gold} or 'The answer is gold')"
