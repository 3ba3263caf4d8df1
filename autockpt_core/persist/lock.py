"""One writer per checkpoint directory: an exclusive ``flock`` on the directory itself.

A session takes the lock when it opens (``CheckpointSession.open``) and gives it back in
``finish()`` or ``close()``; the operating system drops it when the process dies (SIGKILL
included), so a crash never leaves a stale lock. The lock is on the directory's own inode, so
removing a file cannot let a second writer in. ``autockpt.lock`` in it names the holder (host,
pid, framework, start time) for the error a second session gets, and is locked as well (what
sessions of earlier autockpt releases lock); it is opened without following a symbolic link,
so a link planted there is refused instead of overwriting its target. A released lock removes
its file; a killed holder's file stays, unlocked, and the next session takes it over.

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

    def __init__(self, path: Path, dir_fd: int, fd: int, holder: Holder) -> None:
        self.path = path
        self.holder = holder
        self._dir_fd: int | None = dir_fd
        self._fd: int | None = fd
        self.key = _file_key(dir_fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    @classmethod
    def acquire(cls, directory: Path, holder: Holder, field: str = "dirpath") -> DirectoryLock | None:
        """Lock ``directory`` (created if missing) or raise :class:`DirectoryLockedError`.

        ``field`` names the setting that points there (``dirpath``, or ``mirror``) in messages.

        Returns None, with a ``RuntimeWarning``, where the filesystem cannot lock. A lock file
        that is a symbolic link raises ``OSError(ELOOP)`` naming it; other ``OSError`` (the path
        is a file, no permission) propagate.
        """
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LOCK_NAME
        collected = False
        while True:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                key = _file_key(dir_fd)
                os.close(dir_fd)
                if _held_here(key) and not collected:
                    # An unreachable session of this process releases its lock when collected.
                    collected = True
                    gc.collect()
                    continue
                raise _locked_error(directory, _read_holder(path), _held_here(key), field) from None
            except OSError as exc:
                os.close(dir_fd)
                if exc.errno not in _UNSUPPORTED:
                    raise
                _warn_unsupported(directory, exc, field)
                return None
            try:
                fd = _open_lock_file(path)
            except BaseException:
                os.close(dir_fd)  # closing unlocks
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a session of an earlier release
            except BlockingIOError:
                text = _read(fd)
                os.close(fd)
                os.close(dir_fd)
                raise _locked_error(directory, text, False, field) from None
            except BaseException:
                os.close(fd)
                os.close(dir_fd)
                raise
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(dataclasses.asdict(holder)).encode("utf-8"), 0)
            except BaseException:  # e.g. ENOSPC: closing unlocks
                os.close(fd)
                os.close(dir_fd)
                raise
            lock = cls(path, dir_fd, fd, holder)
            with _held_guard:
                _held.add(lock)
            return lock

    def release(self) -> None:
        """Remove the lock file, then unlock. Idempotent; a no-op in a forked child."""
        with _held_guard:
            fd, self._fd = self._fd, None
            dir_fd, self._dir_fd = self._dir_fd, None
            _held.discard(self)
        if fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # harmless: the next session takes the unlocked file over
            log.warning("autockpt: could not remove the lock file %s: %s", self.path, exc)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
            if dir_fd is not None:
                try:
                    fcntl.flock(dir_fd, fcntl.LOCK_UN)
                finally:
                    os.close(dir_fd)

    def _forget(self) -> None:
        """In a forked child: close the inherited descriptors without unlocking the parent's lock."""
        fd, self._fd = self._fd, None
        dir_fd, self._dir_fd = self._dir_fd, None
        for descriptor in (fd, dir_fd):
            if descriptor is not None:
                os.close(descriptor)


def _open_lock_file(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(
                errno.ELOOP,
                f"{path} is a symbolic link; autockpt writes its lock file itself and does not follow links "
                "there (it would overwrite the target). Remove the link",
                str(path),
            ) from None
        raise


def _read_holder(path: Path) -> str:
    """The holder text of a lock file, without following a link; empty when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return ""
    try:
        return _read(fd)
    finally:
        os.close(fd)


def lock_directory(storage: Storage, framework: str, field: str = "dirpath") -> DirectoryLock | None:
    """Lock the directory of a local storage; None for remote storage (fsspec URLs).
    ``field``: the setting that names it, for messages."""
    path = storage.local_path(LOCK_NAME)
    if path is None:
        return None
    return DirectoryLock.acquire(Path(path).parent, Holder.current(framework), field)


def _locked_error(directory: Path, text: str, same_process: bool, field: str = "dirpath") -> DirectoryLockedError:
    holder = _parse(text)
    who = Holder(**holder).describe() if holder is not None else "details not written yet"
    if same_process:
        message = (
            f"autockpt: another CheckpointSession in this process ({who}) still holds {directory}. "
            f"Fix: call finish() (or close()) on that session first, or give this one another {field}."
        )
    else:
        what = f"is writing checkpoints to {directory}" if field == "dirpath" else f"uses {directory} as its {field}"
        message = (
            f"autockpt: another session {what} ({who}); two writers "
            "in one directory would delete or overwrite each other's checkpoints"
            + (" and resume each other's runs" if field == "mirror" else "")
            + f". Fix: wait for that run to end (or stop it), or give this run another {field}."
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


def _held_here(key: tuple[int, int]) -> bool:
    with _held_guard:
        return any(lock.key == key for lock in _held)


def _warn_unsupported(directory: Path, exc: OSError, field: str = "dirpath") -> None:
    message = (
        f"autockpt: the filesystem of {directory} does not support file locks ({exc}); a second run "
        f"writing to this {field} at the same time is not detected"
        + (", and leftovers of interrupted writes are not cleaned up" if field == "dirpath" else "")
        + f". Give every run its own {field}."
    )
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _after_fork_in_child() -> None:
    # No lock taken here: another thread of the parent may have held _held_guard at the fork.
    for lock in list(_held):
        lock._forget()
    _held.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
