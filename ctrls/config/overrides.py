"""Dotted ``key=value`` overrides: their string form (a papermill parameter, a shell ``-o`` list)
and their parsing into a mapping of YAML values. ``ctrls.config.schema`` applies and validates them.
"""
from __future__ import annotations

import json
import re
import typing
from typing import Any

import yaml

from ctrls.errors import ConfigError  # noqa: F401 (raised here; re-exported)

# ---- YAML as the config reads it ----------------------------------------------------------
# Numbers as written (YAML 1.2's core schema): PyYAML's YAML 1.1 reads 010 as 8 (octal), 1:30 as 90
# (sexagesimal) and 1_000 as 1000, and 1e-3 (no dot) as a string. Here 010 is 10, 0o10 is 8, 0x10
# is 16, 1e-3 is 0.001, and 1:30 and 1_000 are strings (which a number key refuses, naming itself).
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
MAX_YAML_NODES = 100_000  # a config's YAML, aliases expanded, has at most this many values


def _core_schema(cls: type) -> type:
    cls.yaml_implicit_resolvers = {c: [(t, rx) for t, rx in rs if t not in (_INT, _FLOAT)]
                                   for c, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    cls.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
    cls.add_implicit_resolver(_FLOAT, re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                                                 r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
                              list("-+0123456789."))
    return cls


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    v = loader.construct_scalar(node)
    for prefix, base in (("0o", 8), ("0x", 16)):
        if v.startswith(prefix):
            return int(v[2:], base)
    return int(v, 10)


@_core_schema
class _Loader(yaml.SafeLoader):
    what = "the YAML"  # names the text in errors (set by load_yaml)

    def construct_mapping(self, node, deep=False):
        """A mapping whose own keys are distinct: a key given twice (``seed: 5`` then ``seed: 6``) is a
        ConfigError naming it, never the last one winning. Keys merged in by ``<<`` may be overridden."""
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                k, line = self.construct_object(key_node), key_node.start_mark.line + 1
                if k in seen:
                    raise ConfigError(f"{self.what}: {short(k)} is given twice (lines {seen[k]} and {line}); give each key once")
                seen[k] = line
        return super().construct_mapping(node, deep)


_Loader.add_constructor(_INT, _construct_int)


@_core_schema
class _Dumper(yaml.SafeDumper):
    """Quotes the strings :class:`_Loader` would read as numbers (``'1e3'``), so a saved config reads back."""


def _expanded_size(node: yaml.Node, what: str, aliases: bool) -> int:
    """Values in ``node`` with aliases expanded (each shared node counted where it is used); refuses
    an alias where ``aliases`` is false, a recursive alias, and more than :data:`MAX_YAML_NODES`."""
    sizes: dict[int, int] = {}
    stack: set[int] = set()

    def size(n: yaml.Node) -> int:
        if id(n) in sizes:
            if not aliases:
                raise ConfigError(f"{what} uses a YAML alias (*name); give the value itself")
            return sizes[id(n)]
        if id(n) in stack:
            raise ConfigError(f"{what} holds a recursive YAML alias")
        stack.add(id(n))
        kids = n.value if isinstance(n, yaml.SequenceNode) else \
            [c for kv in n.value for c in kv] if isinstance(n, yaml.MappingNode) else []
        total = 1 + sum(size(c) for c in kids)
        stack.discard(id(n))
        if total > MAX_YAML_NODES:
            raise ConfigError(f"{what} expands to more than {MAX_YAML_NODES:,} values (YAML aliases); a config is smaller")
        sizes[id(n)] = total
        return total

    return size(node)


def load_yaml(text: str, what: str, aliases: bool = True) -> Any:
    """``text`` read as the config reads YAML: numbers as written (YAML 1.2), aliases expanded to at
    most :data:`MAX_YAML_NODES` values (none at all unless ``aliases``). ``what`` names the text in
    errors; a ``yaml.YAMLError`` is the caller's to word."""
    loader = _Loader(text)
    loader.what = what
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, what, aliases)
        return loader.construct_document(node)
    except RecursionError:
        raise ConfigError(f"{what} is nested too deeply") from None
    finally:
        loader.dispose()


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def short(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters so an error stays one short line; a large value is never
    written out whole first (a profile of aliases expands to hundreds of MB): strings are cut before their repr,
    and lists and mappings show their first items (``reprlib``)."""
    import reprlib

    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value):,} characters)"
    bounded = reprlib.Repr()  # attributes, not keywords: Python 3.10 and 3.11 take none
    bounded.maxlevel = 4
    bounded.maxtuple = bounded.maxlist = bounded.maxarray = bounded.maxdict = bounded.maxset = 8
    bounded.maxfrozenset = bounded.maxdeque = 8
    bounded.maxstring = bounded.maxlong = bounded.maxother = limit
    r = bounded.repr(value)
    return r if len(r) <= limit else f"{r[:limit]}..."


_OPEN, _CLOSE = "[{(", "]})"


def _scan(s: str, state: tuple[int, str]) -> tuple[list[int], tuple[int, str]]:
    """Walk ``s`` from ``state`` = (bracket depth, open quote char or ""); return the indices of
    the whitespace at depth 0 outside quotes, and the state at the end. A quote opens only where a
    YAML scalar can start (after '=', a bracket, ',', ':' or whitespace), so o'brien stays plain."""
    depth, quote = state
    cuts, i = [], 0
    while i < len(s):
        c = s[i]
        if quote:
            if quote == '"' and c == "\\":
                i += 1
            elif c == quote:
                if quote == "'" and s[i + 1:i + 2] == "'":
                    i += 1  # '' is an escaped quote inside '...'
                else:
                    quote = ""
        elif c in "'\"" and (i == 0 or s[i - 1] in "=[{(,: \t"):
            quote = c
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif c.isspace() and depth <= 0:
            cuts.append(i)
        i += 1
    return cuts, (depth, quote)


def split_overrides(text: str) -> list[str]:
    """``"grid.epsilons=[0.1, 0.3] rl.steps=3"`` -> ``["grid.epsilons=[0.1, 0.3]", "rl.steps=3"]``.

    The string form of the overrides (a papermill parameter): items are separated by whitespace
    outside brackets and quotes, so a YAML list or a quoted string with spaces stays one item."""
    cuts, (depth, quote) = _scan(text, (0, ""))
    if depth or quote:
        raise ConfigError(f"overrides {short(text)}: unbalanced {'quote' if quote else 'brackets'}")
    bounds = [-1, *cuts, len(text)]
    return [text[a + 1:b] for a, b in zip(bounds, bounds[1:]) if text[a + 1:b].strip()]


def _regroup(items: typing.Iterable[str]) -> list[str]:
    """Join list items that a shell split inside brackets (``-o grid.epsilons=[0.1, 0.3]`` unquoted
    gives ``grid.epsilons=[0.1,`` and ``0.3]``) back into one item."""
    out, buf, state = [], None, (0, "")
    for item in items:
        buf = item if buf is None else f"{buf} {item}"
        _, state = _scan(item, state)
        if state == (0, ""):
            out.append(buf)
            buf = None
        elif state[0] < 0:
            raise ConfigError(f"override {short(buf)}: unbalanced brackets")
    if buf is not None:
        raise ConfigError(f"override {short(buf)}: unbalanced {'quote' if state[1] else 'brackets'}")
    return out


def join_overrides(items: typing.Iterable[str]) -> str:
    """The string form of a list of overrides, which :func:`split_overrides` splits back into the
    same settings (an item whose value has a bare space, e.g. a path, is written as JSON)."""
    out = []
    for item in _regroup(items):
        if split_overrides(item) != [item]:
            k, v = item.split("=", 1) if "=" in item else (item, "")
            item = f"{k}={json.dumps(_yaml_value(item, v), default=str)}"
        out.append(item)
    return " ".join(out)


def _yaml_value(item: str, v: str) -> Any:
    try:
        return load_yaml(v, f"override {short(item)}", aliases=False) if v.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {short(item)}: the value is not valid YAML "
                          f"({short(' '.join(str(e).split()), 300)})") from None


def parse_overrides(items: str | typing.Iterable[str] | dict[str, Any] | None) -> dict[str, Any]:
    """``["a.b=1", "c=[1, 2]"]`` or ``"a.b=1 c=[1, 2]"`` -> ``{"a.b": 1, "c": [1, 2]}`` (values
    parsed as YAML; see :func:`split_overrides` for the string form)."""
    if not items:
        return {}
    if isinstance(items, dict):
        return check_unique_keys(dict(items), "the overrides")
    items = split_overrides(items) if isinstance(items, str) else _regroup(items)
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {short(item)} is not of the form key=value")
        k, v = item.split("=", 1)
        if k.strip() in out:  # "seed=5 seed=6": refused, not the last one winning
            raise ConfigError(f"override {short(item)}: {k.strip()!r} is given twice in the overrides; give each key once")
        out[k.strip()] = _yaml_value(item, v)
    return check_unique_keys(out, "the overrides")


def check_unique_keys(mapping: dict[str, Any], what: str) -> dict[str, Any]:
    """``mapping`` when no dotted key is set twice in it, whether as ``data.n_test`` beside a ``data``
    section holding ``n_test`` or otherwise; else a ConfigError naming the key."""
    seen: set[str] = set()

    def walk(m: dict, prefix: str) -> None:
        for k, v in m.items():
            full = f"{prefix}{k}"
            if isinstance(v, dict) and v:
                walk(v, full + ".")
            elif full in seen:
                raise ConfigError(f"{what}: {full!r} is given twice; give each key once")
            else:
                seen.add(full)

    walk({k: v for k, v in mapping.items() if isinstance(k, str)}, "")
    return mapping
