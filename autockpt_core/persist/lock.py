"""One writer per checkpoint directory: an exclusive ``flock`` on ``autockpt.lock`` in it.

A session takes the lock when it opens (``CheckpointSession.open``) and gives it back in
``finish()`` or ``close()``; the operating system drops it when the process dies (SIGKILL
included), so a crash never leaves a stale lock. The file names its holder (host, pid,
framework, start time) for the error a second session gets. A released lock removes its file;
a killed holder's file stays, unlocked, and the next session takes it over.

Threading and processes: one :class:`DirectoryLock` per session, taken and released on the
training thread. A second lock on the same directory fails inside one process too (flock
locks belong to the open file, not to the process). A process forked while a lock is held
(a DataLoader worker) closes its inherited copy at once, so a worker that outlives a killed
trainer cannot keep the directory locked.

Only local directories are locked (:func:`lock_directory`): fsspec URLs have no lock here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import fcntl
import gc
import json
import logging
import os
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from ..errors import DirectoryLockedError
from .storage import Storage

LOCK_NAME = "autockpt.lock"
_UNSUPPORTED = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}
"""flock errors that mean "this filesystem cannot lock" (Lustre without -o flock, some FUSE mounts)."""

log = logging.getLogger("autockpt")
_held: set[DirectoryLock] = set()
_held_guard = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a directory lock: written into the lock file, quoted in the error."""

    host: str
    pid: int
    framework: str
    started: float

    @classmethod
    def current(cls, framework: str) -> Holder:
        return cls(socket.gethostname(), os.getpid(), framework, time.time())

    def describe(self) -> str:
        started = dt.datetime.fromtimestamp(self.started).isoformat(timespec="seconds")
        return f"host {self.host}, pid {self.pid}, framework {self.framework!r}, started {started}"


class DirectoryLock:
    """A held lock on one directory; :meth:`release` is idempotent."""

    def __init__(self, path: Path, fd: int, holder: Holder) -> None:
        self.path = path
        self.holder = holder
        self._fd: int | None = fd
        self.key = _file_key(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    @classmethod
    def acquire(cls, directory: Path, holder: Holder) -> DirectoryLock | None:
        """Lock ``directory`` (created if missing) or raise :class:`DirectoryLockedError`.

        Returns None, with a ``RuntimeWarning``, where the filesystem cannot lock. Other
        ``OSError`` (the path is a file, no permission) propagate.
        """
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LOCK_NAME
        collected = False
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                key, text = _file_key(fd), _read(fd)
                os.close(fd)
                if _held_here(key) and not collected:
                    # An unreachable session of this process releases its lock when collected.
                    collected = True
                    gc.collect()
                    continue
                raise _locked_error(directory, text, same_process=_held_here(key)) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno not in _UNSUPPORTED:
                    raise
                _warn_unsupported(directory, exc)
                return None
            if not _same_file(fd, path):  # its holder released (and removed) it meanwhile
                os.close(fd)
                continue
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(dataclasses.asdict(holder)).encode("utf-8"), 0)
            except BaseException:  # e.g. ENOSPC: closing unlocks
                os.close(fd)
                raise
            lock = cls(path, fd, holder)
            with _held_guard:
                _held.add(lock)
            return lock

    def release(self) -> None:
        """Remove the lock file, then unlock. Idempotent; a no-op in a forked child."""
        with _held_guard:
            fd, self._fd = self._fd, None
            _held.discard(self)
        if fd is None:
            return
        try:
            os.unlink(self.path)  # before unlocking: a waiter that locked the old file sees it gone
        except FileNotFoundError:
            pass
        except OSError as exc:  # harmless: the next session takes the unlocked file over
            log.warning("autockpt: could not remove the lock file %s: %s", self.path, exc)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _forget(self) -> None:
        """In a forked child: close the inherited descriptor without unlocking the parent's lock."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def lock_directory(storage: Storage, framework: str) -> DirectoryLock | None:
    """Lock the directory of a local storage; None for remote storage (fsspec URLs)."""
    path = storage.local_path(LOCK_NAME)
    if path is None:
        return None
    return DirectoryLock.acquire(Path(path).parent, Holder.current(framework))


def _locked_error(directory: Path, text: str, same_process: bool) -> DirectoryLockedError:
    holder = _parse(text)
    who = Holder(**holder).describe() if holder is not None else "details not written yet"
    if same_process:
        message = (
            f"autockpt: another CheckpointSession in this process ({who}) still holds {directory}. "
            "Fix: call finish() (or close()) on that session first, or give this one another dirpath."
        )
    else:
        message = (
            f"autockpt: another session is writing checkpoints to {directory} ({who}); two writers "
            "in one directory would delete or overwrite each other's checkpoints. Fix: wait for that "
            "run to end (or stop it), or give this run another dirpath."
        )
    return DirectoryLockedError(message, str(directory), holder)


def _parse(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
        Holder(**data)
    except (ValueError, TypeError):
        return None
    return data if isinstance(data, dict) else None


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", errors="replace")


def _file_key(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == _file_key(fd)


def _held_here(key: tuple[int, int]) -> bool:
    with _held_guard:
        return any(lock.key == key for lock in _held)


def _warn_unsupported(directory: Path, exc: OSError) -> None:
    message = (
        f"autockpt: the filesystem of {directory} does not support file locks ({exc}); a second run "
        "writing to this dirpath at the same time is not detected, and leftovers of interrupted "
        "writes are not cleaned up. Give every run its own dirpath."
    )
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _after_fork_in_child() -> None:
    # No lock taken here: another thread of the parent may have held _held_guard at the fork.
    for lock in list(_held):
        lock._forget()
    _held.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
