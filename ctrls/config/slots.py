"""Where a stage's run lives: its slot, so that runs of different configs never overwrite each other.

A stage's plain directory (``runs/<profile>/exploration``, ``runs/<profile>/pretrain/<pair>/adapter``) holds the
first run made there, which for a build is the profile's own (the run the book reads). A run under another config,
one whose stage key differs, lives beside it in ``<directory>@<key>`` (``exploration@3f9c0a1b2d4e5f60``), with its
outputs outside the directory slotted the same way (``checkpoint@<key>``): as Hydra and MLflow keep one directory
per run. Each run is found again by its key, wherever it was made first; ``ctrls runs`` lists them and
``ctrls runs rm`` removes one.
"""
from __future__ import annotations

import os
from pathlib import Path

SLOT = "@"  # between a stage's directory name and the key of the run in it


def beside(plain: Path, key: str) -> Path:
    """The slot beside ``plain`` for a run of stage key ``key``: ``<plain>@<key>``."""
    return plain.with_name(f"{plain.name}{SLOT}{key}")


def stored_key(directory: Path) -> str | None:
    """The stage key a run directory holds (its ``key`` file), or None when it holds none (or it is a link, which
    the stage refuses when it begins: a link is never read here)."""
    f = Path(directory) / "key"
    if os.path.islink(f) or not f.is_file():
        return None
    try:
        return f.read_text().strip() or None
    except OSError:
        return None


def slot_dir(plain: Path, key: str) -> Path:
    """The directory of the run of stage key ``key``: ``<plain>@<key>`` when that exists; else ``plain`` when it
    holds this key's run or no run yet; else (another config's run is there) ``<plain>@<key>``."""
    plain = Path(plain)
    there = beside(plain, key)
    if there.is_dir():
        return there
    held = stored_key(plain)
    return plain if held is None or held == key else there


def slotted(path: Path, plain: Path, directory: Path) -> Path:
    """``path`` (an output outside the stage's directory, e.g. a checkpoint) in the slot ``directory`` of ``plain``:
    the same suffix on its name (``checkpoint`` -> ``checkpoint@<key>``)."""
    suffix = Path(directory).name[len(Path(plain).name):]
    return Path(path).with_name(Path(path).name + suffix) if suffix else Path(path)


def split_slot(name: str) -> tuple[str, str | None]:
    """``("exploration", "3f9c...")`` for ``"exploration@3f9c..."``, ``(name, None)`` for a plain directory."""
    base, sep, key = name.partition(SLOT)
    return (base, key) if sep else (name, None)
