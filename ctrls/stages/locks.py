"""One writer per stage, and no link followed: a stage's exclusive lock (``fcntl.flock``, else the recorded pid),
the refusal of symbolic links where a stage writes its markers, and the one-line errors for a directory a stage
cannot write (unwritable, a full disk). ``ctrls.stages.runs.Stage`` takes these; details: book/reliability.md.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import socket
import time
import weakref
from pathlib import Path

from ctrls.errors import says_full_disk

log = logging.getLogger(__name__)


class StageBusyError(RuntimeError):
    """Another process is writing this stage (it holds the stage's lock); the message names it."""


class RunDirError(RuntimeError):
    """A stage cannot write its run directory: a directory it cannot write, or a link; the message names it."""


class UnsafeLinkError(RunDirError):
    """A stage's lock or marker is a symbolic link: refused, never followed."""


def refuse_link(path: Path) -> Path:
    """``path``, or :class:`UnsafeLinkError` naming it when it is a symbolic link."""
    if os.path.islink(path):
        raise UnsafeLinkError(f"{path} is a symbolic link (to {os.readlink(path)}): a stage's lock and markers are "
                              "never followed, so that nothing outside the run directory is written; remove it")
    return path


def raise_unwritable(e: OSError, path: str | Path) -> None:
    """Raise ``e`` writing ``path`` as :class:`RunDirError` or :class:`UnsafeLinkError` when it is one."""
    where = Path(e.filename or path)
    if e.errno == errno.ELOOP:  # O_NOFOLLOW met a link
        refuse_link(where)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        raise RunDirError(f"cannot write {where}: no space left on the device that holds it ({e.strerror or e}); "
                          "free some space or use a run_dir on another disk; the stage's finished outputs are kept") from e
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        raise RunDirError(f"cannot write {where} ({e.strerror or e}): the directory {where.parent} is not writable "
                          "(the run directory may be, but not this directory under it); make it writable or use "
                          "another run_dir") from e


@contextlib.contextmanager
def writing(path: str | Path):
    """A failed write of ``path`` in the block is a :class:`RunDirError` naming it for a full disk or an unwritable
    directory (``raise_unwritable``); safetensors reports a full disk in its own error, read for OS error 28."""
    try:
        yield
    except OSError as e:
        raise_unwritable(e, path)
        raise
    except Exception as e:
        if says_full_disk(e):
            raise_unwritable(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)), path)
        raise


def replace_file(path: Path, write) -> None:
    """``write(tmp)`` to a new file renamed over ``path`` (a link there replaced, not written through), under :func:`writing`."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(3)}.tmp")  # .tmp: never an output; 11 bytes (PAIR_NAME_ROOM)
    with writing(path):
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))  # new: not a link
        try:
            write(tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)  # gone after the replace; a half-written one on an error


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:  # alive, another user's
        return True
    except OSError:  # ProcessLookupError: gone
        return False
    return True


class StageLock:
    """An exclusive ``fcntl.flock`` on ``path``, which holds the holder's pid, host and stage.

    The kernel drops the lock however its holder exits: a dead process's lock file is taken over.
    Without ``flock`` the recorded pid is the lock, taken over when it no longer runs on this host.
    The file is removed on release, still locked (a taker checks it locked the file at ``path``)."""

    def __init__(self, path: Path, stage: str):
        self.path, self.stage, self.fd, self.pid = path, stage, None, os.getpid()

    def holder(self) -> dict:
        try:  # never through a link
            with os.fdopen(os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)) as f:
                rec = json.loads(f.read() or "{}")
        except (OSError, ValueError):
            return {}
        return rec if isinstance(rec, dict) else {}

    @staticmethod
    def describe(h: dict) -> str:
        if not h.get("pid"):
            return "another process (it has not recorded its pid yet)"
        return f"pid {h['pid']} on host {h.get('host', '?')}" + (f" since {h['since']}" if h.get("since") else "")

    def _open(self) -> int:
        """The lock file, created if need be, never through a link (:class:`UnsafeLinkError`)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise_unwritable(e, self.path)
            raise

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX
            return self._acquire_by_pid()
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self.busy(self.holder()) from None
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                return self._acquire_by_pid()
            with contextlib.suppress(FileNotFoundError):  # released and removed between our open and our lock?
                if os.lstat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            os.close(fd)
        self.fd = fd
        left = self.holder()  # a lock file left by a process that died holding it: the kernel let us take it
        if left.get("pid") and (left.get("pid"), left.get("host")) != (os.getpid(), socket.gethostname()):
            log.info("%s: took over the lock left by %s, which no longer holds it", self.path, self.describe(left))
        self._write(fd)

    def _acquire_by_pid(self) -> None:
        """No flock on this file system: the recorded pid is the lock (taken over when it is dead)."""
        h = self.holder()
        if not (isinstance(h.get("pid"), int) and not isinstance(h["pid"], bool) and h["pid"] > 0):
            h = {}  # no holder recorded (or garbage): free
        here = h.get("host") == socket.gethostname()
        if h.get("pid") and h["pid"] != os.getpid() and (not here or pid_alive(h["pid"])):
            raise self.busy(h, hint="" if here else
                            f" (this file system has no flock and the holder runs on another host: if it is "
                            f"gone, remove {self.path})")
        if h.get("pid") and h["pid"] != os.getpid():
            log.warning("%s: taking over the lock of %s, which no longer runs", self.path, self.describe(h))
        fd = self._open()
        self._write(fd)
        os.close(fd)
        self.fd = -1  # held by pid, no descriptor

    def _write(self, fd: int) -> None:
        rec = {"pid": os.getpid(), "host": socket.gethostname(), "stage": self.stage,
               "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(rec) + "\n").encode(), 0)

    def busy(self, h: dict, hint: str = "") -> StageBusyError:
        return StageBusyError(
            f"stage {self.stage} is being written by {self.describe(h)} (lock {self.path}): one writer per stage; "
            f"wait for it to finish, or use another run_dir{hint}")

    def release(self) -> None:
        if self.fd is None or self.pid != os.getpid():  # never release a lock a forked parent holds
            return
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)  # while still locked: nobody holds a lock on a removed file
        if self.fd >= 0:
            os.close(self.fd)  # drops the flock
        self.fd = None

    @property
    def held(self) -> bool:
        return self.fd is not None and self.pid == os.getpid()

    def __del__(self):  # the last Stage object holding it is gone (e.g. after an exception): release
        with contextlib.suppress(Exception):  # at interpreter exit; the kernel drops the flock anyway
            self.release()


# the locks this process holds, by file: a stage begun again in this process (a retry) takes its own over
HELD_LOCKS: "weakref.WeakValueDictionary[str, StageLock]" = weakref.WeakValueDictionary()
