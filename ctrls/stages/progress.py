"""The stages' progress bars, relayed: each bar is ``tqdm.auto.tqdm``'s, and when ``$CTRLS_PROGRESS`` names a file
it also writes its state there (what it counts, how far, the rate and the time left), at most once a second.
``ctrls reproduce`` sets the variable for the notebooks' kernels and prints one line per stage from it
(:func:`watch`), so a long cell shows the stage's own progress (questions, epochs, RL steps) rather than a
still cell bar. The file is plain JSON, written through a temporary file renamed into place.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

from tqdm.auto import tqdm as _auto_tqdm

ENV = "CTRLS_PROGRESS"
EVERY_S = 1.0  # the most often a bar writes its state


class tqdm(_auto_tqdm):  # noqa: N801 (tqdm's own name: the stages import it in its place)
    """``tqdm.auto.tqdm`` that also writes its state to ``$CTRLS_PROGRESS`` (when set and the bar is shown)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._relay_file = os.environ.get(ENV) if not self.disable else None
        self._relayed_at = 0.0
        self._relay(force=True)

    def update(self, n=1):
        out = super().update(n)
        self._relay()
        return out

    def close(self):
        self._relay(force=True)
        super().close()

    def _relay(self, force: bool = False) -> None:
        if not getattr(self, "_relay_file", None):
            return
        now = time.monotonic()
        if not force and now - self._relayed_at < EVERY_S:
            return
        self._relayed_at = now
        with contextlib.suppress(Exception):  # progress never stops a stage
            write_state(Path(self._relay_file), state_of(self.format_dict))


def state_of(d: dict) -> dict:
    """A bar's ``format_dict`` as the relayed state: desc, n, total, unit, rate (per second) and eta_s."""
    n, total, rate = d.get("n", 0), d.get("total"), d.get("rate")
    if rate is None and d.get("elapsed") and n:
        rate = n / d["elapsed"]
    eta = (total - n) / rate if total and rate else None
    return {"desc": d.get("prefix") or "", "n": n, "total": total, "unit": d.get("unit", "it"),
            "rate": rate, "eta_s": eta, "time": time.time()}


def write_state(path: Path, state: dict) -> None:
    """The relay file, replaced whole (a bar drops a failed write: progress is advisory)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(json.dumps(state).encode())
    os.replace(tmp, path)


def read_state(path: Path) -> dict | None:
    """The last relayed state, or None (no file yet, or not a state)."""
    try:
        state = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and "n" in state else None


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def describe(state: dict) -> str:
    """One line: "(f) adapter: 3/10 epoch, 0.5 epoch/s, 0:00:14 left"."""
    n, total, unit = state.get("n", 0), state.get("total"), state.get("unit", "it")
    text = f"{state.get('desc') or 'working'}: {n:g}" + (f"/{total:g}" if total else "") + f" {unit}"
    if state.get("rate"):
        text += f", {state['rate']:.3g} {unit}/s"
    if state.get("eta_s") is not None:
        text += f", {_clock(state['eta_s'])} left"
    return text


@contextlib.contextmanager
def watch(path: Path, prefix: str, every_s: float = 1.0, quiet_s: float = 30.0, stream=None):
    """While the block runs, print the relayed progress in ``path`` after ``prefix``: on a terminal one line
    rewritten in place, else a line when the bar changes and at most every ``quiet_s`` seconds. ``$CTRLS_PROGRESS``
    names ``path`` in the block (the kernels papermill starts inherit it)."""
    stream = stream or sys.stdout
    tty = bool(getattr(stream, "isatty", lambda: False)())
    path = Path(path)
    path.unlink(missing_ok=True)
    old, stop = os.environ.get(ENV), threading.Event()
    os.environ[ENV] = str(path)
    shown = {"line": None, "at": 0.0}

    def show():
        state = read_state(path)
        if state is None:
            return
        line = f"{prefix} {describe(state)}"
        now = time.monotonic()
        if line == shown["line"] or (not tty and now - shown["at"] < quiet_s and shown["line"] is not None
                                     and state.get("desc") == shown.get("desc")):
            return
        stream.write(f"\r{line[:160]:<160}" if tty else line + "\n")
        stream.flush()
        shown.update(line=line, at=now, desc=state.get("desc"))

    def loop():
        while not stop.wait(every_s):
            show()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        if tty and shown["line"] is not None:
            stream.write("\n")
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old
        path.unlink(missing_ok=True)


__all__ = ["ENV", "describe", "read_state", "state_of", "tqdm", "watch"]
