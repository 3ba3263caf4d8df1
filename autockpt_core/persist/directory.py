"""Taking a checkpoint directory into use: lock it, probe it with a real write, clean it up.

:func:`open_directory` is what ``CheckpointSession.open()`` does, in this order (training
thread): the directory lock (:mod:`.lock`; local storage only), a probe file written and
deleted through the storage (so an unwritable ``dirpath`` fails at train start, not at the
first checkpoint), then, when resuming and only under the lock, the leftovers of
interrupted writes (:mod:`.leftovers`). Any failure gives the lock back before it is raised.
A mirror (``Config.mirror``) is probed the same way, after ``dirpath``.
"""

from __future__ import annotations

import logging
import uuid
import warnings

from ..errors import ConfigError
from .failures import fix_for
from .leftovers import remove_leftovers
from .lock import DirectoryLock, lock_directory
from .manifest import read_manifest
from .storage import TEMP_PREFIX, Storage

log = logging.getLogger("autockpt")


def open_directory(
    storage: Storage, framework: str, suffix: str, resume: bool, mirror: Storage | None = None
) -> DirectoryLock | None:
    """Lock, probe (``mirror`` too, if given) and (``resume``) clean up; returns the held lock
    (None: remote storage).

    Raises ``ConfigError`` (field ``dirpath``, or ``mirror``: the location, the OS error and
    the fix) when the directory cannot be created or written, ``DirectoryLockedError`` when
    another session holds it, ``ValueError`` when resuming finds an unreadable manifest
    (nothing removed).
    """
    try:
        lock = lock_directory(storage, framework)
    except OSError as exc:
        raise unwritable(storage, exc) from exc
    try:
        probe(storage)
        if mirror is not None:
            probe_mirror(storage, mirror, framework, resume)
        if lock is not None and resume:
            remove_leftovers(storage, lock.path.parent, suffix)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def probe_mirror(storage: Storage, mirror: Storage, framework: str, resume: bool) -> None:
    """Probe the mirror; a failure is a ``ConfigError`` (field ``mirror``) on a first start, and
    only a warning when this run resumes from checkpoints of its own in ``dirpath`` (an outage
    must not keep a job from going on: uploads are retried, see :mod:`.mirror`)."""
    try:
        probe(mirror, field="mirror")
    except ConfigError as exc:
        try:
            local = resume and any(r.framework == framework for r in read_manifest(storage))
        except Exception:  # noqa: BLE001 - an unreadable dirpath manifest: the resume reports it
            local = False
        if not local:
            raise
        message = (
            f"autockpt: the mirror {mirror.location} cannot be written now ({exc.problem}); training goes on "
            f"from the checkpoints in {storage.location}, and uploads are tried again at every checkpoint"
        )
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=5)


def probe(storage: Storage, field: str = "dirpath") -> None:
    """Write a small file through ``storage`` (atomically, as a checkpoint is) and delete it;
    a failure is a ``ConfigError`` naming ``field``, the setting that points there."""
    name = f"{TEMP_PREFIX}probe-{uuid.uuid4().hex[:12]}"  # a temporary's name: a crash here leaves no stray
    try:
        storage.write_atomic(name, lambda f: f.write(b"autockpt write probe\n"))
        storage.delete(name)
    except Exception as exc:  # remote backends raise their own types
        raise unwritable(storage, exc, field) from exc


def unwritable(storage: Storage, exc: BaseException, field: str = "dirpath") -> ConfigError:
    fix = fix_for(exc, field)
    return ConfigError(field, storage.location, f"cannot be written ({type(exc).__name__}: {exc})", fix)
