"""Run directories: ``runs/<profile>/<stage>/<backbone>__<dataset>/`` with a ``done`` marker.

A stage directory holds the resolved ``config.yaml``, its outputs and a ``done`` file written last. A
stage is reused when its marker carries the same key (a hash of the config sections it depends on and
of its upstream stages' keys); a run of another key lives beside it, in ``<stage>@<key>`` (its slot,
``ctrls.config.slots``), so that no config's run overwrites another's; an interrupted stage resumes.
The marker records the sha256 of every output and a digest of the inputs it read: a missing or changed output
is logged, deleted and redone, and a marker without checksums is not trusted.
Nothing outside ``run_dir`` is cleared (``ctrls.data.names.check_inside``) and a marker naming another
path is corrupt; :meth:`Stage.begin` takes an exclusive lock (else :class:`StageBusyError`); links are
refused (:class:`UnsafeLinkError`), an unwritable directory is :class:`RunDirError`; files load through
:func:`load_torch` (``weights_only=True``, else :class:`UnsafeArtifactError`), :func:`read_parquet` and
:func:`check_safetensors`. Details: book/method.md, "ctrls/stages/runs.py"; guarantees: book/reliability.md.
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

from ctrls.config.schema import Config, save_config
from ctrls.config.slots import slot_dir, slotted, stored_key
from ctrls.data.names import check_inside, file_name, inside, pair_slug, slug  # noqa: F401 (file_name, pair_slug, slug: re-exported)
from ctrls.errors import ConfigError
from ctrls.stages.locks import (  # noqa: F401 (re-exported: the run directory's errors and writers)
    HELD_LOCKS,
    RunDirError,
    StageBusyError,
    StageLock,
    UnsafeLinkError,
    pid_alive,
    raise_unwritable,
    refuse_link,
    replace_file,
    writing,
)

log = logging.getLogger(__name__)

PROVENANCE = ("commit", "finished")  # the done marker's record of when and from which commit (``ctrls runs``)
MARKERS = ("done", "key", "config.yaml")  # a stage's own bookkeeping, not outputs
BAD_FILE_HINT = ("it is truncated or corrupt: rerun the stage that writes it (a rerun verifies a finished "
                 "stage's files and redoes a bad one)")


class ArtifactError(RuntimeError):
    """A run artifact is missing, truncated or corrupt; the message names the file."""


def safe_name(name: str) -> str:
    """``name`` with every character but letters, digits, '-', '_' and '.' replaced by '_'. Not
    injective: for names that must not collide use :func:`file_name`."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


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


class UnsafeArtifactError(ArtifactError):
    """A run file that only a full unpickler could load: refused, because unpickling it could run code."""


# what torch's weights-only unpickler says of a pickle beyond tensors and plain containers ("Unsupported
# global: GLOBAL numpy...", "Trying to load unsupported GLOBAL posix.system", "Unsupported operand 149")
_UNSAFE_PICKLE = ("unsupported", "allowed global")


def unsafe_error(path: Path, why: str) -> UnsafeArtifactError:
    """The error for a run file that would need the full unpickler: names the file, never loads it."""
    return UnsafeArtifactError(
        f"{path} is refused: it holds Python objects beyond tensors and plain containers ({why}), and loading it "
        "could run code. Run files are loaded with torch.load(weights_only=True) only. If this run directory's "
        "own (older) version wrote it, delete it and rerun the stage that writes it; if not, do not trust the "
        "run directory")


def load_torch(path: str | Path, **kwargs: Any) -> Any:
    """``torch.load(path, weights_only=True, **kwargs)``: tensors and plain containers only, never code.
    An unreadable file raises :class:`ArtifactError` naming it; a file that would need the full unpickler
    (a class, a function, ``__reduce__``) raises :class:`UnsafeArtifactError` naming it, running nothing
    it holds. ``weights_only=False`` is refused."""
    import pickle

    import torch

    if kwargs.pop("weights_only", True) is not True:
        raise ValueError("load_torch loads run files with weights_only=True only: unpickling one could run code")
    path = Path(path)
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        text = str(e)
        if any(m in text.lower() for m in _UNSAFE_PICKLE):
            lines = [ln.replace("WeightsUnpickler error:", "").strip() for ln in text.splitlines()]
            detail = next((ln for ln in lines if any(m in ln.lower() for m in _UNSAFE_PICKLE)), "")
            raise unsafe_error(path, detail.split(". ")[0].rstrip(".")[:200] or "not a plain-tensor file") from None
        raise artifact_error(path, e) from e
    except Exception as e:  # torch says "Invalid argument" or "PytorchStreamReader failed", not which file
        raise artifact_error(path, e) from e


def read_parquet(path: str | Path, **kwargs: Any):
    """``pandas.read_parquet(path)``; an unreadable file raises :class:`ArtifactError` naming it."""
    import pandas as pd

    try:
        return pd.read_parquet(path, **kwargs)
    except Exception as e:
        raise artifact_error(Path(path), e) from e


def unify_parts(directory: str | Path) -> int:
    """Give every part file of a parquet directory (``samples.parquet/``, ``table2.parquet/``) one schema, so that
    ``pandas.read_parquet(directory)`` reads it whole: a column that is null in some parts (no prediction, no states)
    takes its type from the parts where it is not (``pyarrow.unify_schemas``); those parts are rewritten in place,
    atomically. Run before the stage finishes (its checksums are of the unified parts); the parts rewritten."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = sorted(Path(directory).glob("*.parquet"))
    schemas = {p: pq.read_schema(p) for p in parts}
    if len({s.remove_metadata() for s in schemas.values()}) <= 1:
        return 0
    unified = pa.unify_schemas(list(schemas.values()), promote_options="permissive").remove_metadata()
    rewritten = 0
    for p, s in schemas.items():
        if s.remove_metadata() == unified:
            continue
        table = pq.read_table(p)
        for f in unified:  # a column a part lacks is null there
            if f.name not in table.column_names:
                table = table.append_column(f, pa.nulls(len(table), f.type))
        table = table.select(unified.names).cast(unified)
        replace_file(p, lambda tmp, table=table: pq.write_table(table, tmp))  # under writing: a full disk names p
        rewritten += 1
    return rewritten


def check_safetensors(path: str | Path) -> None:
    """Open a safetensors file's header (which checks that it covers the whole file)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt"):
            pass
    except Exception as e:
        raise artifact_error(Path(path), e) from e


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




class Stage:
    """One stage's run directory, keyed by the config sections (and upstream keys) it depends on.
    ``inputs``: the stages whose outputs it reads (it runs again when they are redone with other
    outputs); ``extra``: output files or directories outside ``dir`` (e.g. a checkpoint)."""

    def __init__(self, cfg: Config, name: str, sections: tuple[str, ...], *parts: str,
                 upstream: tuple[str, ...] = (), inputs: tuple["Stage", ...] = (), extra: tuple[Path, ...] = ()):
        self.cfg, self.name, self.root, self.plain = cfg, name, Path(cfg.run_dir), cfg.stage_dir(name, *parts)
        self.inputs = tuple(inputs)
        self._plain_extra = tuple(Path(p) for p in extra)
        for p in (self.plain, *self._plain_extra):  # everything a stage clears or deletes lies inside run_dir
            try:
                check_inside(p, self.root, f"stage {name!r}: the directory")
            except ValueError as e:
                raise ConfigError(str(e)) from None
            if os.path.abspath(p) == os.path.abspath(self.root):
                raise ConfigError(f"stage {name!r}: its directory would be the run directory {self.root} itself")
        self.key = hashlib.sha256(json.dumps([cfg.fingerprint(*sections), list(upstream)]).encode()).hexdigest()[:16]
        self._place()
        self.bad: list[Path] = []  # outputs that failed verification: deleted when the stage begins again
        self.problems: list[str] = []  # what verification found, one line per file
        self._files_ok: bool | None = None  # verification result, computed once per Stage object
        self._unverifiable = False  # a done marker without checksums, or corrupt: cleared and redone when begun
        self._lock: StageLock | None = None

    def _place(self) -> None:
        """``dir`` and ``extra`` in this key's slot (``ctrls.config.slots``): the plain directory when it holds this
        key's run or none, else ``<dir>@<key>`` beside it; another config's run is never cleared nor overwritten."""
        self.dir = slot_dir(self.plain, self.key)
        self.extra = tuple(slotted(p, self.plain, self.dir) for p in self._plain_extra)

    @property
    def slot(self) -> str:
        """The slot's suffix: "" for the plain directory, "@<key>" for a run beside it."""
        return self.dir.name[len(self.plain.name):]

    @property
    def done_file(self) -> Path:
        return self.dir / "done"

    def _record(self) -> dict | None:
        """The ``done`` marker, or None when there is none or it is unreadable or corrupt (logged);
        :class:`UnsafeLinkError` when it is a symbolic link."""
        if not refuse_link(self.done_file).exists():
            return None
        try:
            rec = json.loads(self.done_file.read_text())
        except (OSError, ValueError) as e:
            log.warning("%s is unreadable (%s): the stage will run again", self.done_file, e)
            return None
        why = self._corrupt(rec)
        if why:
            # its file list is not trusted: the stage's own directory is cleared when it begins
            log.warning("%s is corrupt (%s): nothing it names is trusted or deleted; the stage is cleared and "
                        "runs again", self.done_file, why)
            self.problems = [f"{self.done_file} is corrupt: {why}"]
            self._unverifiable = True
            return None
        return rec

    def _corrupt(self, rec: Any) -> str | None:
        """Why a parsed ``done`` marker is not one this class wrote, or None when its shape is right
        and every file it names lies inside the stage (its directory or an ``extra`` output)."""
        if not isinstance(rec, dict):
            return f"a JSON {type(rec).__name__}, not an object"
        if not isinstance(rec.get("key"), str):
            return "no string 'key'"
        files, inputs = rec.get("files"), rec.get("inputs")
        if files is not None and not (isinstance(files, dict) and all(isinstance(v, str) for v in files.values())):
            return "'files' is not an object of checksums"
        if inputs is not None and not (isinstance(inputs, dict) and
                                       all(v is None or isinstance(v, str) for v in inputs.values())):
            return "'inputs' is not an object of digests"
        for rel in files or {}:
            if self._output_path(rel) is None:
                return f"it names {rel!r}, which is not an output inside the stage directory {self.dir}"
        return None

    def _output_path(self, rel: str) -> Path | None:
        """The output that ``rel`` (relative to ``dir``, as :meth:`manifest` writes it) names, or None
        when it is not one: resolved (``..`` and symbolic links), it must lie strictly inside ``dir``
        (not one of its markers) or be, or lie inside, an ``extra`` output."""
        if not rel or "\0" in rel or os.path.isabs(rel):
            return None
        p = Path(os.path.normpath(self.dir / rel))
        real, d = os.path.realpath(p), os.path.realpath(self.dir)
        if real.startswith(d.rstrip(os.sep) + os.sep) and real != d:
            return None if os.path.relpath(real, d) in MARKERS else p
        xs = [os.path.realpath(e) for e in self.extra]
        return p if any(real == x or real.startswith(x.rstrip(os.sep) + os.sep) for x in xs) else None

    def is_done(self) -> bool:
        """Finished with this key, every recorded output intact, and its inputs as they were. Reads
        only: a finished stage is reused without its lock (the run directory may be read-only)."""
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
            p = self._output_path(rel)
            if p is None or not inside(p, self.root):  # _record refused such a marker already
                self.problems.append(f"{self.done_file} names {rel!r}, outside the stage")
                self._unverifiable = True
                continue
            try:
                actual = sha256_file(p)
            except FileNotFoundError:
                self.problems.append(f"{p} is missing")
                log.warning("%s is missing (an output of the finished stage %s): running the stage again", p, self.dir)
                continue
            except IsADirectoryError:
                self.problems.append(f"{p} is a directory, not the file the stage wrote")
                log.warning("%s is a directory where the finished stage wrote a file: removing it and redoing it", p)
                self.bad.append(p)
                continue
            except OSError as e:
                actual = f"unreadable: {e}"
            if actual != sha:
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
        return hashlib.sha256(json.dumps(rec["files"], sort_keys=True).encode()).hexdigest() if "files" in rec else "unverified"

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in (self._record() or {}).items() if k not in ("files", "inputs", *PROVENANCE)}

    @property
    def lock_file(self) -> Path:
        """The stage's lock: next to its directory (clearing the directory never removes it)."""
        return self.dir.parent / f".{self.dir.name}.lock"

    def lock(self) -> "Stage":
        """Take the stage's exclusive lock (one writer per stage), or raise :class:`StageBusyError`
        naming the process that holds it. Re-entrant within this process."""
        if self._lock is not None and self._lock.held:
            return self
        key = os.path.abspath(self.lock_file)
        held = HELD_LOCKS.get(key)
        if held is None or not held.held:
            held = StageLock(self.lock_file, str(self.dir))
            held.acquire()
            HELD_LOCKS[key] = held
        self._lock = held
        return self

    def release(self) -> None:
        """Give the stage's lock back (done by :meth:`finish`, and on an exception inside ``with``)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "Stage":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def begin(self, force: bool = False, keep: bool = False, check=None) -> "Stage":
        """Take the stage's lock (:meth:`lock`), then create the directory; clear it when forced, when
        it holds another config's outputs (unless ``keep``: a cache valid across configs) or when its
        ``done`` marker is corrupt or has no checksums. Outputs that failed verification are deleted
        and the ``done`` marker removed. The lock is held until :meth:`finish` or :meth:`release`
        (``with stage.begin():`` releases it on an exception too); a begin that fails gives it back. ``check``
        (no arguments) is called under the lock before anything is cleared or created, and may refuse: nothing is
        removed for a run the stage could not make anyway (a missing fit)."""
        if self._lock is None or not self._lock.held:
            self._place()  # where this key's run is now (another config's run may have taken the plain directory)
        self.lock()
        if stored_key(self.dir) not in (None, self.key):  # taken between placing and locking: beside it instead
            self.release()
            self._place()
            self.lock()
        try:
            return self._prepare(force, keep, check)
        except BaseException as e:
            self.release()
            if isinstance(e, OSError):
                raise_unwritable(e, self.dir)
            raise

    def _prepare(self, force: bool, keep: bool, check=None) -> "Stage":
        for m in MARKERS:  # never read nor written through a link
            refuse_link(self.dir / m)
        if self._files_ok is None and not self._unverifiable:
            self._record()  # a corrupt marker: clear the stage (nothing it names is touched)
        key_file = self.dir / "key"
        stale = key_file.exists() and (not key_file.is_file() or key_file.read_text().strip() != self.key)
        unverifiable = self._unverifiable
        if check is not None:
            check()  # refuses before anything is removed or created
        if (force or stale or unverifiable) and self.dir.exists() and not keep:
            log.info("clearing %s (%s)", self.dir, "forced" if force else "config changed" if stale
                     else "outputs without checksums, or a corrupt done marker")
            self._remove(self.dir)
        for p in self.bad:
            self._remove(p)
        self.bad, self.problems, self._files_ok, self._unverifiable = [], [], None, False
        self.dir.mkdir(parents=True, exist_ok=True)
        for m in MARKERS:  # a marker replaced by a directory is removed like a bad output
            if (self.dir / m).is_dir():
                self._remove(self.dir / m)
        self.done_file.unlink(missing_ok=True)
        replace_file(key_file, lambda p: p.write_text(self.key))
        replace_file(self.dir / "config.yaml", lambda p: save_config(self.cfg, p))
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
        """Write the ``done`` marker: the summary, the sha256 of every output, and the inputs' digests;
        then release the stage's lock."""
        self.lock()
        try:
            from ctrls.method.backbone import git_commit

            rec = {"key": self.key, "wall_s": round(time.time() - getattr(self, "_t0", time.time()), 1), **summary,
                   "commit": git_commit(), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "files": self.manifest(), "inputs": {st.key: st.digest() for st in self.inputs}}
            replace_file(self.done_file, lambda p: p.write_text(json.dumps(rec, indent=1, default=str)))
            self._files_ok = True
        finally:
            self.release()


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """Append whole rows to a JSON-lines file, synced (a reader stopping at the last complete line sees no half row)."""
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())
