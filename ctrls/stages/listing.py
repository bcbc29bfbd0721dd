"""What a run directory holds: every stage run stored under it (``ctrls runs``), and the explicit removal of one
(``ctrls runs rm``).

Each run is a stage directory with a ``key`` file: the profile's first run in the plain directory, a run of another
config beside it in ``<stage>@<key>`` (``ctrls.config.slots``). A run is listed with the overrides that make its
config differ from its profile's, the commit it was made at and when it finished, all read from its own
``config.yaml`` (plain YAML, never code) and ``done`` marker. Removal takes the stage's lock (a running stage is
refused) and deletes the run's directory and the outputs its marker records beside it (its checkpoint), nothing else.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrls.config.overrides import load_yaml
from ctrls.config.schema import load_config
from ctrls.config.slots import split_slot, stored_key
from ctrls.data.names import check_inside
from ctrls.stages.locks import StageLock

log = logging.getLogger(__name__)

# set per pair by the stages (Config.for_pair) and where the run is written: not an override of the profile's
PER_RUN = ("run_dir", "profile", "backbone.name", "data.dataset")


@dataclass
class StoredRun:
    """One stage run under a run directory."""

    name: str  # relative to the run directory: "demo/exploration", "demo/rl@3f9c0a1b2d4e5f60"
    path: Path
    key: str
    finished: bool  # a done marker with this run's key
    overrides: list[str] = field(default_factory=list)  # key=value where its config differs from its profile's
    commit: str = ""
    time: str = ""  # when it finished (UTC), else when its directory last changed

    @property
    def slot(self) -> str | None:
        """The key in the directory's name, or None for the plain directory (the profile's first run)."""
        return split_slot(self.path.name)[1]


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _defaults(profile: str, memo: dict) -> dict[str, Any] | None:
    if profile not in memo:
        try:
            memo[profile] = _flat(load_config(profile).to_dict())
        except Exception:  # a profile this checkout lacks: its overrides cannot be told
            memo[profile] = None
    return memo[profile]


def overrides_of(config_yaml: Path, memo: dict | None = None) -> list[str] | None:
    """``key=value`` for each key where the stored config differs from its profile's (None: unreadable, or a
    profile this checkout does not have)."""
    try:
        stored = load_yaml(config_yaml.read_text(), str(config_yaml), aliases=False)
    except Exception:
        return None
    if not isinstance(stored, dict):
        return None
    base = _defaults(str(stored.get("profile", "")), {} if memo is None else memo)
    if base is None:
        return None
    flat = _flat(stored)
    return [f"{k}={json.dumps(v)}" for k, v in flat.items() if k not in PER_RUN and k in base and base[k] != v]


def _record(path: Path) -> dict:
    done = path / "done"
    if os.path.islink(done) or not done.is_file():
        return {}
    try:
        rec = json.loads(done.read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def stored_runs(run_dir: str | Path, profile: str | None = None) -> list[StoredRun]:
    """Every stage run under ``run_dir`` (of ``profile`` only, if given), sorted by name."""
    root = Path(run_dir)
    tops = [root / profile] if profile else sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    runs, memo = [], {}
    for top in tops:
        for d, subdirs, _ in os.walk(top):
            here = Path(d)
            key = stored_key(here)
            if key is None:
                subdirs.sort()
                continue
            subdirs.clear()  # a run's own directories hold no other runs
            rec = _record(here)
            done = rec.get("key") == key
            when = rec.get("finished") if done else None
            runs.append(StoredRun(name=here.relative_to(root).as_posix(), path=here, key=key, finished=done,
                                  overrides=overrides_of(here / "config.yaml", memo) or [],
                                  commit=str(rec.get("commit", "")) if done else "",
                                  time=str(when or _mtime(here))))
    return sorted(runs, key=lambda r: r.name)


def _mtime(path: Path) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(path.stat().st_mtime))


def listing(run_dir: str | Path, profile: str | None = None) -> str:
    """The runs under ``run_dir`` as a table: name, state, commit, time and overrides (one line each)."""
    runs = stored_runs(run_dir, profile)
    if not runs:
        return f"no stage runs under {Path(run_dir).resolve()}"
    rows = [("run", "state", "commit", "time", "overrides")]
    rows += [(r.name, "finished" if r.finished else "unfinished", r.commit or "-", r.time,
              " ".join(r.overrides) or "(the profile's own)") for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4] for row in rows)


class RunNotFoundError(ValueError):
    """``ctrls runs rm`` was given a name that is no stored run; the message names it and how to list them."""


def remove_run(run_dir: str | Path, name: str) -> list[Path]:
    """Delete the stored run ``name`` (as :func:`listing` names it) and the outputs its done marker records beside
    its directory (its checkpoint), under the stage's lock; the paths removed. Nothing outside the run is touched."""
    root = Path(run_dir).resolve()
    path = Path(os.path.normpath(root / name))
    try:
        check_inside(path, root, "ctrls runs rm: the run")
    except ValueError as e:
        raise RunNotFoundError(str(e)) from None
    if path == root or os.path.islink(path) or stored_key(path) is None:
        raise RunNotFoundError(f"{name!r} is not a stage run under {root} (ctrls runs lists them)")
    beside = set()
    for rel in (_record(path).get("files") or {}):
        try:
            first = Path(os.path.normpath(path / rel)).relative_to(path.parent).parts[0]
        except (ValueError, IndexError, TypeError):  # a marker naming anything further: nothing of it is removed
            continue
        if first not in (path.name, "..") and not first.startswith("."):
            beside.add(path.parent / first)  # an output outside the directory, as ``extra``: e.g. checkpoint@<key>
    lock = StageLock(path.parent / f".{path.name}.lock", str(path))
    lock.acquire()  # StageBusyError while a process writes the run
    try:
        gone = []
        for p in [path, *sorted(beside)]:
            check_inside(p, root, "ctrls runs rm: an output")
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
            else:
                continue
            gone.append(p)
            log.info("removed %s", p)
        return gone
    finally:
        lock.release()


__all__ = ["RunNotFoundError", "StoredRun", "listing", "overrides_of", "remove_run", "stored_runs"]
