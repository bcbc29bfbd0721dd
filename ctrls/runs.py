"""Run directories: ``runs/<profile>/<stage>/<backbone>__<dataset>/`` with a ``done`` marker.

Each stage directory holds the resolved config (``config.yaml``), the stage's outputs, and a
``done`` file written last. A stage is reused when its ``done`` marker carries the same key
(a hash of the config sections it depends on and of its upstream stages' keys). A directory
whose key differs holds stale outputs of another config: it is cleared before the stage starts.
An interrupted stage (no ``done``, same key) resumes from what it wrote.

What is on disk is verified, not trusted. The ``done`` marker records the sha256 of every output
file (``files``) and a digest of the outputs of the stages it read (``inputs``). A rerun hashes
the outputs again: a missing or changed file is logged by name and the stage runs again, after
deleting the bad file, so a stage that resumes per shard (features, exploration parts, RL runs)
redoes that shard only; an output replaced by a directory is removed and redone the same way. A
``done`` marker without checksums (from an older version) is not trusted: the stage is cleared and
runs again. A stage whose input stage was redone with other outputs runs again too.

Nothing outside ``run_dir`` is cleared or deleted: a stage directory, an extra output or a path
named by a ``done`` marker that lies outside it is refused (``ctrls.names.check_inside``).
Loads at stage boundaries go through :func:`load_torch`, :func:`read_parquet` and
:func:`check_safetensors`, whose errors name the file.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ctrls.config import Config, save_config
from ctrls.overrides import ConfigError
from ctrls.names import check_inside, file_name, inside, slug  # noqa: F401 (file_name, slug: re-exported)

log = logging.getLogger(__name__)

MARKERS = ("done", "key", "config.yaml")  # a stage's own bookkeeping, not outputs
BAD_FILE_HINT = ("it is truncated or corrupt: rerun the stage that writes it (a rerun verifies a finished "
                 "stage's files and redoes a bad one)")


class ArtifactError(RuntimeError):
    """A run artifact is missing, truncated or corrupt; the message names the file."""


def safe_name(name: str) -> str:
    """``name`` with every character but letters, digits, '-', '_' and '.' replaced by '_'. Not
    injective: for names that must not collide use :func:`file_name`."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def pair_slug(backbone: str, dataset: str) -> str:
    return f"{slug(backbone)}__{slug(dataset)}"


# ---- checksums and loads that name the file ---------------------------------------------------


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """The sha256 of a file, read in chunks (files of any size)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def artifact_error(path: Path, e: Exception) -> ArtifactError:
    """The error for a run file that could not be read: names the file, the cause and the remedy."""
    if isinstance(e, FileNotFoundError):
        return ArtifactError(f"{path} is missing: run the stage that writes it")
    return ArtifactError(f"cannot read {path} ({type(e).__name__}: {e}); {BAD_FILE_HINT}")


def load_torch(path: str | Path, **kwargs: Any) -> Any:
    """``torch.load(path, **kwargs)``; an unreadable file raises :class:`ArtifactError` naming it."""
    import torch

    path = Path(path)
    try:
        return torch.load(path, **kwargs)
    except Exception as e:  # torch says "Invalid argument" or "PytorchStreamReader failed", not which file
        raise artifact_error(path, e) from e


def read_parquet(path: str | Path, **kwargs: Any):
    """``pandas.read_parquet(path)``; an unreadable file raises :class:`ArtifactError` naming it."""
    import pandas as pd

    path = Path(path)
    try:
        return pd.read_parquet(path, **kwargs)
    except Exception as e:
        raise artifact_error(path, e) from e


def check_safetensors(path: str | Path) -> None:
    """Open a safetensors file's header (which checks that it covers the whole file)."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), "pt"):
            pass
    except Exception as e:
        raise artifact_error(path, e) from e


def parquet_rows(path: Path) -> int | None:
    """The row count in a parquet file's footer; None (logged, naming the file) when it cannot be read."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception as e:
        log.warning("%s is unreadable (%s: %s): it will be redone", path, type(e).__name__, e)
        return None


def valid_part(path: Path, rows: int) -> bool:
    """Whether a part file written earlier can be reused: a readable parquet of ``rows`` rows.
    A missing part is simply not reusable; a truncated one or one of another length is logged."""
    if not path.exists():
        return False
    n = parquet_rows(path)
    if n is not None and n != rows:
        log.warning("%s holds %d rows, expected %d: it will be redone", path, n, rows)
    return n == rows


# ---- stages ------------------------------------------------------------------------------------


class Stage:
    """One stage's run directory, keyed by the config sections (and upstream keys) it depends on.

    ``inputs``: the stages whose outputs this one reads (it runs again when they are redone with
    other outputs). ``extra``: output files or directories outside ``dir`` (e.g. a checkpoint).
    """

    def __init__(self, cfg: Config, name: str, sections: tuple[str, ...], *parts: str,
                 upstream: tuple[str, ...] = (), inputs: tuple["Stage", ...] = (), extra: tuple[Path, ...] = ()):
        self.cfg = cfg
        self.name = name
        self.root = Path(cfg.run_dir)
        self.dir = cfg.stage_dir(name, *parts)
        self.inputs = tuple(inputs)
        self.extra = tuple(Path(p) for p in extra)
        for p in (self.dir, *self.extra):  # everything a stage clears or deletes lies inside run_dir
            try:
                check_inside(p, self.root, f"stage {name!r}: the directory")
            except ValueError as e:
                raise ConfigError(str(e)) from None
            if os.path.abspath(p) == os.path.abspath(self.root):
                raise ConfigError(f"stage {name!r}: its directory would be the run directory {self.root} itself")
        h = hashlib.sha256(json.dumps([cfg.fingerprint(*sections), list(upstream)]).encode())
        self.key = h.hexdigest()[:16]
        self.bad: list[Path] = []  # outputs that failed verification: deleted when the stage begins again
        self.problems: list[str] = []  # what verification found, one line per file
        self._files_ok: bool | None = None  # verification result, computed once per Stage object
        self._unverifiable = False  # a done marker without checksums: cleared and redone when the stage begins

    @property
    def done_file(self) -> Path:
        return self.dir / "done"

    def _record(self) -> dict | None:
        if not self.done_file.exists():
            return None
        try:
            return json.loads(self.done_file.read_text())
        except (OSError, ValueError) as e:
            log.warning("%s is unreadable (%s): the stage will run again", self.done_file, e)
            return None

    def is_done(self) -> bool:
        """Finished with this key, every recorded output intact, and its inputs as they were."""
        rec = self._record()
        if rec is None or rec.get("key") != self.key:
            return False
        if self._files_ok is None:
            self._files_ok = self._verify(rec.get("files"))
        return self._files_ok and self._inputs_unchanged(rec.get("inputs"))

    def _verify(self, files: dict[str, str] | None) -> bool:
        self.bad, self.problems = [], []
        if not isinstance(files, dict):
            # nothing to check the outputs against: a truncated file would pass for a finished one
            self.problems.append(f"{self.done_file} records no output checksums")
            self._unverifiable = True
            log.warning("%s finished before output checksums were recorded: its outputs cannot be verified, so the "
                        "stage runs again", self.dir)
            return False
        for rel, sha in files.items():
            p = Path(os.path.normpath(self.dir / str(rel)))
            if not inside(p, self.root):
                self.problems.append(f"{p} is outside the run directory")
                log.warning("%s names %s, outside the run directory %s: not trusted, the stage runs again",
                            self.done_file, p, self.root)
                continue
            try:
                actual = sha256_file(p)
            except FileNotFoundError:
                self.problems.append(f"{p} is missing")
                log.warning("%s is missing (an output of the finished stage %s): running the stage again", p, self.dir)
                continue
            except IsADirectoryError:
                actual = "a directory"
            except OSError as e:
                actual = f"unreadable: {e}"
            if actual == "a directory":
                self.problems.append(f"{p} is a directory, not the file the stage wrote")
                log.warning("%s is a directory where the finished stage wrote a file: removing it and redoing it", p)
                self.bad.append(p)
            elif actual != sha:
                self.problems.append(f"{p} is corrupt")
                log.warning("%s is corrupt (its sha256 differs from the one recorded when the stage finished): "
                            "redoing it", p)
                self.bad.append(p)
        return not self.problems

    def _inputs_unchanged(self, recorded: dict[str, str | None] | None) -> bool:
        if recorded is None:  # a marker from before inputs were recorded
            return True
        for st in self.inputs:
            if recorded.get(st.key, "absent") != st.digest():
                log.info("%s: its input %s was redone or is unfinished: running it again", self.dir, st.dir)
                return False
        return True

    def output_files(self) -> list[Path]:
        """Every output file: all files under ``dir`` and ``extra`` but the markers and temp files."""
        found = []
        for root in (self.dir, *self.extra):
            if root.is_file():
                found.append(root)
            elif root.is_dir():
                found += [p for p in root.rglob("*") if p.is_file()]
        own = {self.dir / m for m in MARKERS}
        return sorted({p for p in found if p not in own and not p.name.endswith(".tmp")})

    def manifest(self) -> dict[str, str]:
        """{path relative to ``dir``: sha256} of the outputs as they are now."""
        return {Path(os.path.relpath(p, self.dir)).as_posix(): sha256_file(p) for p in self.output_files()}

    def digest(self) -> str | None:
        """A digest of the outputs recorded by the ``done`` marker; None when the stage is unfinished."""
        rec = self._record()
        if rec is None or rec.get("key") != self.key:
            return None
        if "files" not in rec:
            return "unverified"
        return hashlib.sha256(json.dumps(rec["files"], sort_keys=True).encode()).hexdigest()

    def summary(self) -> dict[str, Any]:
        rec = self._record() or {}
        return {k: v for k, v in rec.items() if k not in ("files", "inputs")}

    def begin(self, force: bool = False, keep: bool = False) -> "Stage":
        """Create the directory; clear it when forced or when it holds another config's outputs
        (unless ``keep``: a stage whose directory holds a cache valid across configs). Outputs that
        failed verification are deleted, and the ``done`` marker removed: the stage is unfinished."""
        key_file = self.dir / "key"
        stale = key_file.exists() and (not key_file.is_file() or key_file.read_text().strip() != self.key)
        unverifiable = self._unverifiable
        if (force or stale or unverifiable) and self.dir.exists() and not keep:
            log.info("clearing %s (%s)", self.dir, "forced" if force else "config changed" if stale
                     else "outputs without checksums")
            self._remove(self.dir)
        for p in self.bad:
            self._remove(p)
        self.bad, self.problems, self._files_ok, self._unverifiable = [], [], None, False
        self.dir.mkdir(parents=True, exist_ok=True)
        for m in MARKERS:  # a marker replaced by a directory is removed like a bad output
            if (self.dir / m).is_dir():
                self._remove(self.dir / m)
        self.done_file.unlink(missing_ok=True)
        key_file.write_text(self.key)
        save_config(self.cfg, self.dir / "config.yaml")
        self._t0 = time.time()
        return self

    def _remove(self, p: Path) -> None:
        """Delete a file or a directory tree, only inside the run directory."""
        check_inside(p, self.root, f"stage {self.name!r}: the output")
        if p.is_dir() and not p.is_symlink():
            log.warning("removing the directory %s", p)
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)

    def finish(self, **summary: Any) -> None:
        """Write the ``done`` marker: the summary, the sha256 of every output, and the inputs' digests."""
        rec = {"key": self.key, "wall_s": round(time.time() - getattr(self, "_t0", time.time()), 1), **summary,
               "files": self.manifest(), "inputs": {st.key: st.digest() for st in self.inputs}}
        tmp = self.done_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=1, default=str))
        tmp.replace(self.done_file)
        self._files_ok = True


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """Append whole rows to a JSON-lines file and sync them to disk (a reader that stops at the
    last complete line never sees half a row)."""
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())
