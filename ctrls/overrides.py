"""Dotted ``key=value`` overrides: their string form (a papermill parameter, a shell ``-o`` list)
and their parsing into a mapping of YAML values. ``ctrls.config`` applies and validates them.
"""
from __future__ import annotations

import json
import typing
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration key is unknown, or its value has the wrong type or is not allowed."""


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
        raise ConfigError(f"overrides {text!r}: unbalanced {'quote' if quote else 'brackets'}")
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
            raise ConfigError(f"override {buf!r}: unbalanced brackets")
    if buf is not None:
        raise ConfigError(f"override {buf!r}: unbalanced {'quote' if state[1] else 'brackets'}")
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
        return yaml.safe_load(v) if v.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({' '.join(str(e).split())})") from None


def parse_overrides(items: str | typing.Iterable[str] | dict[str, Any] | None) -> dict[str, Any]:
    """``["a.b=1", "c=[1, 2]"]`` or ``"a.b=1 c=[1, 2]"`` -> ``{"a.b": 1, "c": [1, 2]}`` (values
    parsed as YAML; see :func:`split_overrides` for the string form)."""
    if not items:
        return {}
    if isinstance(items, dict):
        return dict(items)
    items = split_overrides(items) if isinstance(items, str) else _regroup(items)
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = _yaml_value(item, v)
    return out
