"""The book's "Source of the equation index" page: the source of every function the method page's
index names ("Where each piece lives" in book/method.md), so that each code name there links to
its code.

``index_rows(method_md)`` parses the index; ``write_code_page(book)`` writes
``<book>/generated/code.md`` (``ctrls reproduce`` does, before the book is built), one section per
function with the label ``src_label(file, obj)``, its line range and its source, read from this
checkout with ``inspect``.
"""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# | paper | label | [`ctrls/x.py::obj`](#src-ctrls-x-obj) or `ctrls/x.py::obj` | `tag` | `tests/t.py::fn` |
ROW = re.compile(r"^\| (?P<paper>[^|]+) \| [^|]+ \| \[?`(?P<file>ctrls/[\w/]+\.py)::(?P<obj>[\w.]+)`(?:\]\(#(?P<link>[\w-]+)\))? "
                 r"\| `(?P<tag>[^`]+)` \| `(?P<test>tests/[\w/]+\.py)::(?P<fn>\w+)` \|$")
SECTION = "## Where each piece lives"


def src_label(file: str, obj: str) -> str:
    """The page label of one function's source: ``src-<module path>-<object>`` (``-`` for ``/``, ``.``)."""
    return "src-" + re.sub(r"[^\w]+", "-", f"{file[:-3]}-{obj}").lower()


def index_rows(method_md: str | Path = ROOT / "book" / "method.md") -> list[dict]:
    """The index's rows, each ``{paper, file, obj, link, tag, test, fn}``; a row that does not parse is
    an error that quotes it."""
    text = Path(method_md).read_text()
    section = text[text.index(SECTION):]
    lines = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| paper")]
    rows = []
    for line in lines:
        m = ROW.match(line)
        if not m:
            raise ValueError(f"an index row does not parse: {line!r}")
        rows.append(m.groupdict())
    return rows


def source_of(file: str, obj: str) -> tuple[str, int, int]:
    """(source, first line, last line) of ``obj`` in the module at ``file``."""
    target = importlib.import_module(file[:-3].replace("/", "."))
    for part in obj.split("."):
        target = getattr(target, part)
    lines, start = inspect.getsourcelines(target)
    return "".join(lines), start, start + len(lines) - 1


def code_page(rows: list[dict]) -> str:
    out = ["# Source of the equation index", "",
           "The code of every function that the {ref}`method page's index <equation-index>` names, read from the "
           "checkout that built this book, in the index's order. Each heading is the function's file and name; "
           "the line numbers are those of that checkout.", ""]
    seen = set()
    for r in rows:
        key = (r["file"], r["obj"])
        if key in seen:
            continue
        seen.add(key)
        src, a, b = source_of(*key)
        papers = "; ".join(x["paper"].strip() for x in rows if (x["file"], x["obj"]) == key)
        out += [f"({src_label(*key)})=", f"## `{r['file']}::{r['obj']}`", "",
                f"{papers} · `{r['file']}`, lines {a}–{b} · tested by `{r['test']}::{r['fn']}`", "",
                "```python", src.rstrip(), "```", ""]
    return "\n".join(out)


def write_code_page(book: Path, method_md: str | Path | None = None) -> Path:
    path = Path(book) / "generated" / "code.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code_page(index_rows(method_md or Path(book) / "method.md")))
    return path
