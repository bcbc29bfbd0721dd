"""Count the functions of the book-writing Python that return English assembled from f-strings.

The rule, applied to every ``def`` (methods and nested functions included, each counted on its own)
in ``ctrls/report/`` and ``bench/gpu/``:

- the function has a ``return`` with a value, and
- it returns text: annotated with ``str`` in its return type, or (unannotated) returning a string
  expression (an f-string, a concatenation, a ``join``), and
- its own body (not a nested ``def``'s, and not an error, assertion or log message) holds an
  f-string whose literal text, HTML tags left out, has at least ``MIN_WORDS`` English words
  (runs of two or more letters).

A function that formats one number ("{x:+.1f}") or a path has fewer words than that and is not
counted; one that writes a clause around its numbers is.

    python -m tools.count_sentences            # the total, then one line per package
    python -m tools.count_sentences --list     # every counted function, file:line name
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ctrls/report", "bench/gpu")
MIN_WORDS = 3
_WORD = re.compile(r"[A-Za-z]{2,}")
_MARKUP = re.compile(r"<[^>]*>?|[^<]*>|&\w+;")  # HTML tags (also ones an f-string field splits) and entities


def _literal_words(node: ast.JoinedStr) -> int:
    text = " ".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return len(_WORD.findall(_MARKUP.sub(" ", text)))


_MESSAGES = ("print", "warn", "warning", "info", "debug", "error", "exit", "write", "append_log")


def _is_message(node: ast.AST) -> bool:
    """An error or log message: a ``raise``, an ``assert``, or a call to print/warn/log/exit."""
    if isinstance(node, (ast.Raise, ast.Assert)):
        return True
    if isinstance(node, ast.Call):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        return name in _MESSAGES
    return False


def _own_nodes(func: ast.AST):
    """The nodes of ``func``'s body, not descending into nested functions, classes, lambdas or messages."""
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        if _is_message(node):
            continue
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _returns_text(func: ast.FunctionDef, nodes: list[ast.AST]) -> bool:
    """Annotated to return text (``str`` anywhere in the annotation), or returning a string expression."""
    if func.returns is not None:
        return "str" in ast.unparse(func.returns)
    for node in nodes:
        if isinstance(node, ast.Return) and isinstance(node.value, (ast.JoinedStr, ast.BinOp, ast.Constant, ast.Call)):
            value = node.value
            if isinstance(value, ast.Call):
                if isinstance(value.func, ast.Attribute) and value.func.attr in ("join", "format", "strip"):
                    return True
                continue
            return not (isinstance(value, ast.Constant) and not isinstance(value.value, str))
    return False


def sentence_functions(source: str) -> list[tuple[int, str]]:
    """(line, name) of each function in ``source`` that returns English assembled from f-strings."""
    found = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = list(_own_nodes(func))
        returns = _returns_text(func, nodes)
        wordy = any(isinstance(n, ast.JoinedStr) and _literal_words(n) >= MIN_WORDS for n in nodes)
        if returns and wordy:
            found.append((func.lineno, func.name))
    return sorted(found)


def count(root: Path = ROOT) -> dict[str, list[tuple[str, int, str]]]:
    """Package -> [(file, line, name)] of the counted functions."""
    out: dict[str, list[tuple[str, int, str]]] = {}
    for pkg in PACKAGES:
        rows = []
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            rows += [(rel, line, name) for line, name in sentence_functions(path.read_text(encoding="utf-8"))]
        out[pkg] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every counted function")
    args = parser.parse_args(argv)
    found = count()
    print(sum(len(rows) for rows in found.values()))
    for pkg, rows in found.items():
        print(f"  {pkg}: {len(rows)}")
        if args.list:
            for rel, line, name in rows:
                print(f"    {rel}:{line} {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
