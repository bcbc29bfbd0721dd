"""What each config key means: the docstring under every field of the config dataclasses.

Every field of :class:`ctrls.config.schema.Config` and of the sections it nests carries a string literal on
the line under it (``lr: float = key(...)`` then ``\"\"\"Adam's learning rate ...\"\"\"``). Python keeps no such
string at run time, so it is read here from the source of the dataclasses with ``ast``: nothing of the
module is run beyond importing it.

- :func:`class_docs`: ``{field: docstring}`` of one dataclass;
- :func:`field_docs`: ``{dotted key: docstring}`` of every key of the config, sections included
  (``{"data": ..., "data.dataset": ..., ..., "rl.lr": ...}``); :func:`missing_docs`, the keys without one;
- :func:`explain` and :func:`listing`: what ``ctrls config --explain [KEY]`` prints. An unknown key is a
  :class:`ConfigError` naming the closest known keys.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import textwrap
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from ctrls.config.checks import REMOVED, type_hints
from ctrls.config.schema import Config
from ctrls.errors import ConfigError

SUMMARY_WIDTH = 100  # characters of a docstring that a row of the listing shows


@lru_cache(maxsize=None)
def _classes(path: str) -> dict[str, ast.ClassDef]:
    """The class definitions of a source file by qualified name (``Outer.Inner`` for a nested one)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    out: dict[str, ast.ClassDef] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(prefix + node.name, node)
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return out


def _docstring(node: ast.stmt | None) -> str | None:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return inspect.cleandoc(node.value.value)
    return None


def class_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of every field of the dataclass ``cls``, in the order of
    ``dataclasses.fields``: the string literal statement right under the field's line, "" where there is none.
    A field inherited from a dataclass base gets the docstring written under it there."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(base):
            continue
        node = _classes(inspect.getsourcefile(base))[base.__qualname__]
        body: list[ast.stmt | None] = [*node.body, None]
        for stmt, after in zip(body, body[1:]):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                docs[stmt.target.id] = _docstring(after) or ""
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


def field_docs(root: type = Config, prefix: str = "") -> dict[str, str]:
    """``{dotted key: docstring}`` of every key under the dataclass ``root``, in declaration order. A section
    (a nested dataclass) is a key too and comes before its own keys: ``data``, ``data.dataset``, ..."""
    hints = type_hints(root)
    out: dict[str, str] = {}
    for name, doc in class_docs(root).items():
        out[prefix + name] = doc
        if dataclasses.is_dataclass(hints[name]):
            out.update(field_docs(hints[name], f"{prefix}{name}."))
    return out


def missing_docs(root: type = Config) -> list[str]:
    """The dotted keys under ``root`` whose field has no docstring (or an empty one)."""
    return [k for k, doc in field_docs(root).items() if not doc.strip()]


@lru_cache(maxsize=None)
def _config_docs() -> tuple[tuple[str, str], ...]:
    """:func:`field_docs` of :class:`Config`, read once per process."""
    return tuple(field_docs().items())


# ---- what the command prints ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KeyInfo:
    """One key as ``--explain`` shows it: its docstring, type, default and allowed values."""

    key: str
    doc: str
    type: str
    default: Any
    allowed: str
    section: bool


def _field(key: str) -> tuple[dataclasses.Field, Any, Any]:
    """(the dataclass field of ``key``, its type, its default value)."""
    obj: Any = Config()
    parts = key.split(".")
    for part in parts[:-1]:
        obj = getattr(obj, part)
    f = next(f for f in dataclasses.fields(obj) if f.name == parts[-1])
    return f, type_hints(type(obj))[f.name], getattr(obj, f.name)


def _type_name(tp: Any) -> str:
    if get_origin(tp) is None and isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _allowed(f: dataclasses.Field, tp: Any) -> str:
    """The allowed values in words: the key's rule, else the values its type admits."""
    rule, inner = f.metadata.get("rule"), tp
    if get_origin(tp) is list:
        (inner,) = get_args(tp) or (Any,)
    if rule is not None:
        words = rule.allowed + (f" ({rule.why})" if rule.why else "")
    elif get_origin(inner) is Literal:
        words = " or ".join(str(v) for v in get_args(inner))
    elif inner is bool:
        words = "true or false"
    else:
        words = "any " + _type_name(inner)
    if get_origin(tp) is list:
        words = "a list, each " + words
        words += "".join(s for s, on in (("; not empty", f.metadata.get("nonempty")),
                                          ("; no value twice", f.metadata.get("unique"))) if on)
    return words


def info(key: str) -> KeyInfo:
    """What ``--explain KEY`` shows of ``key`` (:func:`lookup` first: an unknown key is a ConfigError)."""
    doc = dict(_config_docs())[lookup(key)]
    f, tp, default = _field(key)
    if dataclasses.is_dataclass(tp):
        return KeyInfo(key, doc, tp.__name__, None, "a mapping of its keys", True)
    return KeyInfo(key, doc, _type_name(tp), default, _allowed(f, tp), False)


def closest(key: str, keys: typing.Iterable[str], n: int = 5) -> list[str]:
    """Up to ``n`` known keys nearest ``key``: the nearest whole keys by ``difflib``, then those with the same
    last part (``lr``: ``pretrain.lr``, ``rl.lr``, ...), then those whose last part is nearest."""
    keys = list(keys)
    leaf = key.rsplit(".", 1)[-1]
    by_leaf: dict[str, list[str]] = {}
    for k in keys:
        by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    near = difflib.get_close_matches(key, keys, n=n, cutoff=0.6)
    near += [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    near += [k for lf in difflib.get_close_matches(leaf, list(by_leaf), n=n, cutoff=0.75) for k in by_leaf[lf]]
    return list(dict.fromkeys(near))[:n]


def lookup(key: str) -> str:
    """``key`` itself when the config has it; else a ConfigError that names the closest known keys (or says
    what became of a removed key)."""
    docs = dict(_config_docs())
    if key in docs:
        return key
    if key in REMOVED:
        raise ConfigError(f"config key {key!r} was {REMOVED[key]}")
    near = closest(key, docs)
    hint = f"closest known keys: {', '.join(near)}" if near else "ctrls config --explain lists every key"
    raise ConfigError(f"unknown config key {key!r}; {hint}")


def value_text(value: Any) -> str:
    """A default as one line of YAML, as a profile or ``-o key=value`` writes it."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("...\n").strip()


def summary(doc: str, width: int = SUMMARY_WIDTH) -> str:
    """A docstring on one line, cut at a word to at most ``width`` characters."""
    line = " ".join(doc.split())
    return line if len(line) <= width else line[: width - 3].rsplit(" ", 1)[0] + "..."


def listing(prefix: str = "") -> str:
    """One row per key (under ``prefix``, a section's ``rl.``, or all): the key, its default, its docstring's
    first ``SUMMARY_WIDTH`` characters. A section's row shows ``(section)`` for a default."""
    rows = []
    for k, doc in _config_docs():
        if k.startswith(prefix):
            i = info(k)
            rows.append((k, "(section)" if i.section else value_text(i.default), summary(doc)))
    kw, dw = max(len(r[0]) for r in rows), min(16, max(len(r[1]) for r in rows))
    return "\n".join(f"{k:<{kw}}  {d:<{dw}}  {s}".rstrip() for k, d, s in rows)


def explain(key: str) -> str:
    """``key``'s type, default, allowed values and docstring; for a section, its docstring and its keys."""
    i = info(key)
    body = textwrap.fill(" ".join(i.doc.split()), width=SUMMARY_WIDTH, initial_indent="  ", subsequent_indent="  ")
    if i.section:
        return f"{key}: section ({i.type})\n{body}\n\n{listing(key + '.')}"
    return f"{key}: {i.type} = {value_text(i.default)}\n  allowed: {i.allowed}\n{body}"
