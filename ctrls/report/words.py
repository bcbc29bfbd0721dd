"""The book's words and its numbers' formats.

The sentences of the generated parts of the book (the first page's verdict and findings, notes, captions)
live in the book, in ``book/_templates/<name>.md``, one block per phrase::

    <!-- phrase.key -->
    The estimate is {{diff}} points ({{n}} questions).

A block runs to the next ``<!-- ... -->`` header; :func:`say` fills its ``{{name}}`` fields with values
computed by the code, and refuses a field it was not given (no template is written half-filled). Where the
wording depends on the data (a direction, a verdict), the code picks the block by key, and the block holds
the words. The Python returns numbers, frames and keys; this module holds the one formatter per kind of
number: :func:`diff_ci` (a difference with its interval), :func:`rate_n` (a rate with its n) and
:func:`format_p` (a p-value, "<1e-4" below the floor, never "1.52e-24").
"""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path

from ctrls.stats.metrics import format_p  # noqa: F401 (the book's one p-value format, re-exported)

TEMPLATES = Path(__file__).resolve().parents[2] / "book" / "_templates"
_HEADER = re.compile(r"^<!--[ \t]*([\w.\- ]+?)[ \t]*-->[ \t]*$", re.M)
_FIELD = re.compile(r"\{\{\s*(\w+)\s*\}\}")
MINUS = "−"


def minus(s: str) -> str:
    """A number's hyphen as the typographic minus sign."""
    return s.replace("-", MINUS)


def _missing(*xs) -> bool:
    return any(x is None or (isinstance(x, float) and math.isnan(x)) for x in xs)


def diff_ci(d: float, lo: float, hi: float, scale: float = 100.0, digits: int | None = None, arrow: str = "") -> str:
    """A difference with its interval, "+15.0 [−2.1, +30.9]" (``scale`` 100: a fraction shown in points), or
    "+0.17 [+0.05, +0.29]" (``scale`` 1, two decimals); ``arrow`` (↑, ↓, =) before it; "not computed" when any
    part is missing."""
    if _missing(d, lo, hi):
        return "not computed"
    f = f".{digits if digits is not None else (1 if scale != 1 else 2)}f"
    text = minus(f"{scale * d:+{f}} [{scale * lo:+{f}}, {scale * hi:+{f}}]")
    return f"{arrow} {text}" if arrow else text


def rate_n(rate: float, n: int, lo: float | None = None, hi: float | None = None, unit: str = "questions") -> str:
    """A rate with its n: "35.8% [28.1, 44.2] (n = 120 questions)"; the interval only when given."""
    if _missing(rate):
        return "not computed"
    ci = "" if lo is None or hi is None or _missing(lo, hi) else f" [{100 * lo:.1f}, {100 * hi:.1f}]"
    return f"{100 * rate:.1f}%{ci} (n = {n} {unit})"


@functools.lru_cache(maxsize=None)
def phrases(name: str) -> dict[str, str]:
    """The blocks of ``book/_templates/<name>.md``: key -> text (its leading and trailing newlines dropped)."""
    text = (TEMPLATES / f"{name}.md").read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    return {key: body.strip("\n") for key, body in zip(parts[1::2], parts[2::2])}


def say(template: str, key: str, /, **values) -> str:
    """Block ``key`` of template ``template`` with its ``{{fields}}`` filled from ``values``."""
    block = phrases(template)[key]

    def field(m: re.Match) -> str:
        if m.group(1) not in values:
            raise KeyError(f"book/_templates/{template}.md, {key}: no value for {{{{{m.group(1)}}}}}")
        return str(values[m.group(1)])

    return _FIELD.sub(field, block)


__all__ = ["TEMPLATES", "diff_ci", "format_p", "minus", "phrases", "rate_n", "say"]
