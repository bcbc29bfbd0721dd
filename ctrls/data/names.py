"""Names that become parts of paths under the run directory, and the check that keeps paths inside it.

Two rules:

- **Injective file names.** :func:`file_name` turns any string (a problem id, an RL setting's name)
  into one path component: the string itself when it is already plain (lowercase letters, digits,
  ``.``, ``_``, ``-``; at most 80 characters; not starting with ``.``), else a readable slug plus
  ``-`` and 12 hex digits of the sha256 of the exact string. Two different strings get different
  names (up to a hash collision), also on a case-insensitive file system; the few that would still
  share a name (a plain id that imitates another's slug and hash) are refused where they are loaded
  (:func:`colliding`).
- **Confined paths.** :func:`check_inside` refuses a path that is not inside the run directory
  (compared lexically, after ``..`` is resolved; symbolic links are the user's to place), and
  :func:`check_component` refuses a value that would not stay one path component (a separator,
  ``.``, ``..``, a control character, an empty name).
"""
from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from pathlib import Path
from typing import Iterable

_PLAIN = re.compile(r"[a-z0-9_-][a-z0-9._-]{0,79}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
HASH_CHARS = 12


def file_name(name: str) -> str:
    """An injective file-name component for ``name`` (module docstring). Its readable slug spells
    accented letters without their accents ("Größe_é" -> "Groe_e"; other letters are dropped); a name that is not a string is a
    TypeError naming its type."""
    if not isinstance(name, str):
        raise TypeError(f"a file name is made from a string (a problem id, a setting's name), got "
                        f"{type(name).__name__} {repr(name)[:80]}")
    if _PLAIN.fullmatch(name):
        return name
    ascii_ = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    readable = _UNSAFE.sub("_", ascii_).strip("._")[:60] or "x"
    return f"{readable}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:HASH_CHARS]}"


def slug(name: str) -> str:
    """A filesystem-safe, readable name for a backbone id or path (its last component when it is an
    existing path). Not injective ("a/b" and "a_b" share one): ``ctrls.config.schema`` refuses two pairs
    whose names collide; problem ids and setting names go through :func:`file_name`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name if "/" in name and Path(name).exists() else name)


def pair_slug(backbone: str, dataset: str) -> str:
    """The directory name of a (backbone, dataset) pair, ``<backbone>__<dataset>`` (slugs)."""
    return f"{slug(backbone)}__{slug(dataset)}"


# Bytes a stage adds to a pair's name in one file name: the longest is the temporary of the exploration stage's
# part, ".<pair>__eta<float repr>__<row label>__<question file name>.parquet.<6 hex>.tmp" (1+5+24+2+16+2+80+8+11 < 150).
PAIR_NAME_ROOM = 150
DEFAULT_NAME_MAX = 255


def name_max(directory: str | os.PathLike) -> int:
    """The longest file name, in bytes, that the file system holding ``directory`` (or its nearest
    existing parent) takes: ``os.pathconf(..., "PC_NAME_MAX")``, 255 where it does not say."""
    p = Path(directory).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return int(os.pathconf(p, "PC_NAME_MAX"))
    except (OSError, ValueError, TypeError):
        return DEFAULT_NAME_MAX


def colliding(names: Iterable[str], to_file=file_name) -> list[tuple[str, str]]:
    """Pairs of distinct names whose file names are equal (compared case-insensitively); [] if none."""
    seen: dict[str, str] = {}
    out = []
    for n in names:
        f = to_file(n).casefold()
        if f in seen and seen[f] != n:
            out.append((seen[f], n))
        seen.setdefault(f, n)
    return out


def component_problem(value: str) -> str | None:
    """Why ``value`` cannot be one path component, or None when it can."""
    if not isinstance(value, str) or not value.strip():
        return "it is empty"
    if value in (".", ".."):
        return f"{value!r} names a directory relative to its parent"
    if "/" in value or "\\" in value:
        return "it holds a path separator"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "it holds a control character"
    if len(value.encode("utf-8", "surrogatepass")) > 200:
        return "it is longer than 200 bytes"
    return None


def check_component(value: str, what: str) -> str:
    """``value`` when it can be one path component, else ValueError naming ``what``."""
    why = component_problem(value)
    if why:
        raise ValueError(f"{what} {value!r} cannot name a directory: {why}")
    return value


def inside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether ``path`` is ``root`` or below it, lexically (absolute paths, ``..`` resolved)."""
    p, r = os.path.abspath(path), os.path.abspath(root)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


def check_inside(path: str | os.PathLike, root: str | os.PathLike, what: str = "path") -> Path:
    """``Path(path)`` when it lies inside ``root``, else ValueError: nothing outside the run directory
    is ever written, cleared or deleted."""
    if not inside(path, root):
        raise ValueError(f"{what} {os.path.abspath(path)} is outside the run directory {os.path.abspath(root)}: "
                         f"refusing to write or delete there")
    return Path(path)
