"""Run directories: ``runs/<profile>/<stage>/<backbone>__<dataset>/`` with a ``done`` marker.

Each stage directory holds the resolved config (``config.yaml``), the stage's outputs, and a
``done`` file written last. A stage is reused when its ``done`` marker carries the same key
(a hash of the config sections it depends on and of its upstream stages' keys). A directory
whose key differs holds stale outputs of another config: it is cleared before the stage starts.
An interrupted stage (no ``done``, same key) resumes from what it wrote.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

from ctrls.config import Config, save_config

log = logging.getLogger(__name__)


def slug(name: str) -> str:
    """A filesystem-safe name for a backbone id or path."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name if "/" in name and Path(name).exists() else name)


def safe_name(name: str) -> str:
    """``name`` with every character but letters, digits, '-', '_' and '.' replaced by '_'."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def pair_slug(backbone: str, dataset: str) -> str:
    return f"{slug(backbone)}__{slug(dataset)}"


class Stage:
    """One stage's run directory, keyed by the config sections (and upstream keys) it depends on."""

    def __init__(self, cfg: Config, name: str, sections: tuple[str, ...], *parts: str,
                 upstream: tuple[str, ...] = ()):
        self.cfg = cfg
        self.name = name
        self.dir = cfg.stage_dir(name, *parts)
        h = hashlib.sha256(json.dumps([cfg.fingerprint(*sections), list(upstream)]).encode())
        self.key = h.hexdigest()[:16]

    @property
    def done_file(self) -> Path:
        return self.dir / "done"

    def is_done(self) -> bool:
        if not self.done_file.exists():
            return False
        return json.loads(self.done_file.read_text()).get("key") == self.key

    def summary(self) -> dict[str, Any]:
        return json.loads(self.done_file.read_text()) if self.done_file.exists() else {}

    def begin(self, force: bool = False, keep: bool = False) -> "Stage":
        """Create the directory; clear it when forced or when it holds another config's outputs
        (unless ``keep``: a stage whose directory holds a cache valid across configs)."""
        key_file = self.dir / "key"
        stale = key_file.exists() and key_file.read_text().strip() != self.key
        if (force or stale) and self.dir.exists() and not keep:
            log.info("clearing %s (%s)", self.dir, "forced" if force else "config changed")
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        key_file.write_text(self.key)
        save_config(self.cfg, self.dir / "config.yaml")
        self._t0 = time.time()
        return self

    def finish(self, **summary: Any) -> None:
        summary = {"key": self.key, "wall_s": round(time.time() - getattr(self, "_t0", time.time()), 1), **summary}
        tmp = self.done_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=1, default=str))
        tmp.replace(self.done_file)
