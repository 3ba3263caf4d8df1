"""Taking a checkpoint directory into use: lock it, probe it with a real write, clean it up.

:func:`open_directory` is what ``CheckpointSession.open()`` does, in this order (training
thread): the directory lock (:mod:`.lock`; local storage only), a probe file written and
deleted through the storage (so an unwritable ``dirpath`` fails at train start, not at the
first checkpoint), then, when resuming and only under the lock, the leftovers of
interrupted writes (:mod:`.leftovers`). Any failure gives the lock back before it is raised.
:func:`probe_mirror` probes a mirror (``Config.mirror``) the same way, after the lock.
"""

from __future__ import annotations

import uuid

from ..errors import ConfigError
from .failures import fix_for
from .leftovers import remove_leftovers
from .lock import DirectoryLock, lock_directory
from .storage import TEMP_PREFIX, Storage


def open_directory(storage: Storage, framework: str, suffix: str, resume: bool) -> DirectoryLock | None:
    """Lock, probe and (``resume``) clean up; returns the held lock (None: remote storage).

    Raises ``ConfigError`` (field ``dirpath``: the location, the OS error and the fix) when
    the directory cannot be created or written, ``DirectoryLockedError`` when another session
    holds it, ``ValueError`` when resuming finds an unreadable manifest (nothing removed).
    """
    try:
        lock = lock_directory(storage, framework)
    except OSError as exc:
        raise unwritable(storage, exc) from exc
    try:
        probe(storage)
        if lock is not None and resume:
            remove_leftovers(storage, lock.path.parent, suffix)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def probe(storage: Storage) -> None:
    """Write a small file through ``storage`` (atomically, as a checkpoint is) and delete it."""
    name = f"{TEMP_PREFIX}probe-{uuid.uuid4().hex[:12]}"  # a temporary's name: a crash here leaves no stray
    try:
        storage.write_atomic(name, lambda f: f.write(b"autockpt write probe\n"))
        storage.delete(name)
    except Exception as exc:  # remote backends raise their own types
        raise unwritable(storage, exc) from exc


def probe_mirror(storage: Storage) -> None:
    """:func:`probe` for the mirror (``Config.mirror``): a ``ConfigError`` naming ``mirror``."""
    try:
        probe(storage)
    except ConfigError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise unwritable(storage, cause, field="mirror") from cause


def unwritable(storage: Storage, exc: BaseException, field: str = "dirpath") -> ConfigError:
    fix = fix_for(exc).replace("dirpath", field)
    return ConfigError(field, storage.location, f"cannot be written ({type(exc).__name__}: {exc})", fix)
