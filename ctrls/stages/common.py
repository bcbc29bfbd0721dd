"""The plumbing every stage shares, written once: sampling parameters from the config and the
backbone on this rank's device, and which of a stage's files a reader may take as this config's
(:func:`current_outputs`). (Seeds: ``ctrls.method.streams.seed_of``; file names: ``ctrls.stages.runs``.)
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ctrls.config.schema import Config
from ctrls.data.problems import DataError, Problem, TooFewProblems, load_problems
from ctrls.stages.distributed import world
from ctrls.stages.runs import BAD_FILE_HINT, ArtifactError, UnsafeLinkError, read_parquet, refuse_link, replace_file, writing

if TYPE_CHECKING:  # the modelling stack is imported where it is used: a stage that only reads (and the
    # synthetic study's worker processes) does not pay for transformers
    from ctrls.generate.sampling import SampleParams
    from ctrls.method.backbone import Backbone

log = logging.getLogger(__name__)


def sample_params(cfg: Config, temperature: float, **changes) -> SampleParams:
    """``SampleParams`` from ``sampling`` and ``prompt`` keys at temperature eta, with ``changes``
    (``epsilon``, ``transitions``, ...) on top."""
    from ctrls.generate.sampling import SampleParams

    s = cfg.sampling
    return SampleParams(temperature=temperature, top_k=s.top_k, max_new_tokens=s.max_new_tokens,
                        max_steps=cfg.prompt.max_steps, batch_size=s.batch_size, decode=s.decode,
                        compile=s.compile, **changes)


def backbone_for(cfg: Config, name: str | None = None) -> Backbone:
    """The backbone ``name`` (default ``backbone.name``) with the config's dtype and cache, on this
    rank's device (``ctrls.stages.distributed``: ``cuda:<local rank>`` when launched on several GPUs)."""
    from ctrls.method.backbone import load_backbone

    b = cfg.backbone
    return load_backbone(name or b.name, world().device(b.device), b.dtype, b.cache_dir)


def save_torch(obj, path: str | Path) -> None:
    """``torch.save(obj)`` to ``path`` through a Python file: a full disk is then an OSError (torch's own writer says
    only "unexpected pos"), a RunDirError naming ``path`` (``runs.writing``)."""
    import torch

    with writing(path), open(path, "wb") as f:
        torch.save(obj, f)


def save_parquet(df, path: str | Path) -> None:
    """``df`` (a DataFrame or a pyarrow Table) as parquet at ``path``, atomically and under ``runs.writing``
    (``runs.replace_file``: a full disk names ``path``, nothing half-written is left)."""
    if isinstance(df, pd.DataFrame):
        replace_file(Path(path), df.to_parquet)
    else:
        import pyarrow.parquet as pq

        replace_file(Path(path), lambda tmp: pq.write_table(df, tmp))


def save_json(obj, path: str | Path, **kwargs) -> None:
    """``obj`` as JSON at ``path``, atomically and under ``runs.writing``; a non-finite number is a ValueError
    naming ``path`` (JSON has none: a bare ``NaN`` is refused by every strict reader)."""
    try:
        text = json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError as e:
        raise ValueError(f"{path}: not written: {e} (a non-finite number)") from e
    replace_file(Path(path), lambda tmp: Path(tmp).write_text(text))


class NotRunError(FileNotFoundError):
    """A stage's results for *this* config are not on disk: the stage was not run, was run under
    another config (its key differs), or did not finish. The message names the directory and why."""


def current_outputs(stage, what: str, unfinished: bool = False) -> set[Path] | None:
    """The output files of ``stage`` (a ``ctrls.stages.runs.Stage``) that belong to its key, the config's:
    those its ``done`` marker records when it finished with this key; None (every file in the stage
    directory) with ``unfinished`` while a run of this key is under way. A reader (tables, the
    scorecard) takes only these, so results of another config are never read as this one's.

    Raises :class:`NotRunError` naming ``what`` and the stage directory when the stage has not run,
    holds another config's outputs (its ``key`` file differs: e.g. ``grid.n_samples`` changed) or
    has not finished (unless ``unfinished``); :class:`UnreadableResultsError` naming the file when a
    file the marker records is missing (never a smaller sample), or a marker is a symbolic link.
    Reads only: no lock, no checksums."""
    d, key_file = Path(stage.dir), Path(stage.dir) / "key"
    for marker in (key_file, stage.done_file):
        try:
            refuse_link(marker)
        except UnsafeLinkError as e:  # a marker that could point anywhere is never read
            raise UnreadableResultsError(marker, str(e), hint="") from None
    if not key_file.is_file():
        raise NotRunError(f"no {what} in {d}: the {stage.name} stage has not run (run it first)")
    key = key_file.read_text().strip()
    if key != stage.key:
        raise NotRunError(f"the {what} in {d} were made under another config (stage key {key}, this config's "
                          f"{stage.key}: a setting the {stage.name} stage depends on differs): they are not read "
                          f"as this config's; run the {stage.name} stage with this config")
    rec = stage._record()
    if rec is None or rec.get("key") != stage.key or not isinstance(rec.get("files"), dict):
        if unfinished:
            return None
        raise NotRunError(f"the {stage.name} stage in {d} has not finished for this config (no done marker with "
                          f"its key and checksums): rerun it to finish it before reading its {what}")
    files = {Path(os.path.normpath(d / rel)) for rel in rec["files"]}
    gone = sorted(f for f in files if not f.is_file())
    if gone:  # the readers take the recorded files that are there: a deleted part would shrink the sample
        more = f" (and {len(gone) - 1} more recorded file(s))" if len(gone) > 1 else ""
        raise UnreadableResultsError(gone[0], f"it is missing{more}, though the finished {stage.name} stage recorded "
                                     f"it: its {what} are not read without it",
                                     hint=f"rerun the {stage.name} stage to redo it")
    return files


def only_current(files: list[Path], allowed: set[Path] | None) -> list[Path]:
    """``files`` less those not in ``allowed`` (:func:`current_outputs`; None: all), named in the log."""
    if allowed is None:
        return list(files)
    kept = [f for f in files if Path(os.path.normpath(f)) in allowed]
    if len(kept) < len(files):
        log.warning("%d file(s) the finished stage did not record are not read: %s", len(files) - len(kept),
                    ", ".join(str(f) for f in files if Path(os.path.normpath(f)) not in allowed)[:500])
    return kept


class UnreadableResultsError(ArtifactError):
    """A result file of a finished stage that cannot be read, or holds NaN where a result must be:
    ``path`` names it (the scorecard shows "unreadable: <file>")."""

    def __init__(self, path: Path, why: str, hint: str = BAD_FILE_HINT):
        self.path = Path(path)
        super().__init__(f"{path} is unreadable: {why}" + (f"; {hint}" if hint else ""))


def _not_finite(v) -> bool:
    """Whether a result cell is missing: None, NaN or infinite, or an array holding one."""
    if v is None:
        return True
    if isinstance(v, (list, tuple, np.ndarray)):
        try:
            return not np.isfinite(np.asarray(v, dtype=float)).all()
        except (TypeError, ValueError):
            return False
    if isinstance(v, (float, np.floating)):
        return not math.isfinite(v)
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def read_results(path: Path, required: tuple[str, ...] = (), rows=None):
    """A stage's parquet results; :class:`UnreadableResultsError` naming the file when it cannot be
    read or a ``required`` column is absent or holds NaN (on the rows ``rows(df)`` selects, if given)."""
    try:
        df = read_parquet(path)
    except ArtifactError as e:
        raise UnreadableResultsError(path, str(e.__cause__ or e)) from e
    part = df if rows is None else rows(df)
    for c in required:
        if c not in df:
            raise UnreadableResultsError(path, f"no column {c!r}")
        bad = part[c].map(_not_finite)
        if bad.any():
            raise UnreadableResultsError(path, f"NaN in column {c!r} ({int(bad.sum())} of {len(part)} rows)")
    return df


def problems_from_config(cfg: Config, split: str) -> list[Problem]:
    """The profile's seeded subset: ``data.n_train`` or ``data.n_test`` problems of ``data.dataset``."""
    d = cfg.data
    key = "data.n_train" if split == "train" else "data.n_test"
    try:
        return load_problems(d.dataset, split, n=d.n_train if split == "train" else d.n_test, seed=d.seed,
                             data_dir=d.data_dir, max_bad_fraction=d.max_bad_fraction,
                             difficulty=d.word_problems.difficulty())
    except TooFewProblems as e:  # a small dataset: say which key asks for the problems, and the most there are
        raise DataError(f"{e}: {key} asks for more than the split holds; use at most {e.available} "
                        f"(-o {key}={e.available})") from None
