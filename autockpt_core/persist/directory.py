"""Taking a checkpoint directory into use: lock it, probe it with a real write, clean it up.

:func:`open_directory` is what ``CheckpointSession.open()`` does, in this order (training
thread): the directory lock (:mod:`.lock`; local storage only), a probe file written and
deleted through the storage (so an unwritable ``dirpath`` fails at train start, not at the
first checkpoint; on ``s3://`` after one quick request that names a wrong endpoint, a missing
bucket, credentials or a policy, :mod:`.storage_errors`), then, when resuming and only under
the lock, the leftovers of interrupted writes (:mod:`.leftovers`). Any failure gives the lock
back before it is raised. A mirror (``Config.mirror``) is probed the same way, after
``dirpath``, then taken: locked when it is a local directory, claimed when it is a URL
(:mod:`.mirror_claim`).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
import warnings
from typing import Callable

from ..errors import ConfigError, DirectoryLockedError
from .failures import fix_for
from .leftovers import remove_leftovers
from .lock import DirectoryLock, lock_directory
from .manifest import read_manifest
from .mirror_claim import MirrorClaim, take_mirror
from .storage import TEMP_PREFIX, Storage, modified_time
from .storage_errors import check_reachable, diagnose

log = logging.getLogger("autockpt")


@dataclasses.dataclass
class Held:
    """What an open session holds: ``dirpath``'s lock and the mirror's lock or claim (None:
    remote storage, or a filesystem without locks)."""

    lock: DirectoryLock | None
    mirror: DirectoryLock | MirrorClaim | None = None

    def exit_within(self, seconds: float) -> None:
        """The process must exit within ``seconds`` (a preemption): a mirror claim's removal at
        :meth:`release` waits no longer than that."""
        if isinstance(self.mirror, MirrorClaim):
            self.mirror.release_wait_s = min(self.mirror.release_wait_s, max(0.0, seconds))

    def release(self) -> None:
        """Give both back (idempotent); the mirror's first, ``dirpath``'s also when that fails."""
        try:
            if self.mirror is not None:
                self.mirror.release()
        finally:
            if self.lock is not None:
                self.lock.release()


def open_directory(
    storage: Storage,
    framework: str,
    suffix: str,
    resume: bool,
    mirror: Storage | None = None,
    mirror_run: Callable[[], str | None] = lambda: None,
    mirror_lost: Callable[[str], None] = lambda message: None,
    mirror_takeover: bool = False,
) -> Held:
    """Lock, probe (``mirror`` too, if given, which is then taken: ``mirror_run`` names the run
    in its claim, ``mirror_lost`` is called if another session takes it over,
    ``mirror_takeover`` takes a live claim too) and (``resume``) clean up; returns what is held.

    Raises ``ConfigError`` (field ``dirpath``, or ``mirror``: the location, the OS error and
    the fix) when the directory cannot be created or written, ``DirectoryLockedError`` when
    another session holds it (or the mirror), ``ValueError`` when resuming finds an unreadable
    manifest (nothing removed).
    """
    try:
        lock = lock_directory(storage, framework)
    except OSError as exc:
        raise unwritable(storage, exc) from exc
    held = Held(lock)
    try:
        probe(storage)
        if mirror is not None:
            writable, store_now = probe_mirror(storage, mirror, framework, resume)
            held.mirror = take_mirror_or_warn(
                mirror, framework, mirror_run, mirror_lost, writable, store_now, mirror_takeover
            )
        if lock is not None and resume:
            remove_leftovers(storage, lock.path.parent, suffix)
    except BaseException:
        held.release()
        raise
    return held


def take_mirror_or_warn(
    mirror: Storage,
    framework: str,
    run: Callable[[], str | None],
    lost: Callable[[str], None],
    writable: bool,
    store_now: float | None,
    takeover: bool = False,
) -> DirectoryLock | MirrorClaim | None:
    """:func:`~.mirror_claim.take_mirror`; a mirror that cannot be written now (``writable``
    False: its probe warned) and not claimed either gets a warning: the run goes on,
    unprotected from a second writer."""
    try:
        return take_mirror(mirror, framework, run, lost, store_now, takeover)
    except DirectoryLockedError:
        raise
    except Exception as exc:
        if writable:
            raise
        message = (
            f"autockpt: the mirror {mirror.location} could not be claimed ({type(exc).__name__}: {exc}); "
            "a second run using it at the same time is not detected"
        )
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=5)
        return None


def probe_mirror(storage: Storage, mirror: Storage, framework: str, resume: bool) -> tuple[bool, float | None]:
    """Probe the mirror; a failure is a ``ConfigError`` (field ``mirror``) on a first start, and
    only a warning when this run resumes from checkpoints of its own in ``dirpath`` (an outage
    must not keep a job from going on: uploads are retried, see :mod:`.mirror`). Returns the
    whether it could be written, and the mirror's clock at the probe (see :func:`probe`)."""
    try:
        return True, probe(mirror, field="mirror")
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
        return False, None


def probe(storage: Storage, field: str = "dirpath") -> float | None:
    """Write a small file through ``storage`` (atomically, as a checkpoint is) and delete it;
    a failure is a ``ConfigError`` naming ``field``, the setting that points there. Returns
    the file's modification time by the storage's clock (None where it cannot tell)."""
    name = f"{TEMP_PREFIX}probe-{uuid.uuid4().hex[:12]}"  # a temporary's name: a crash here leaves no stray
    try:
        check_reachable(storage, field)  # object storage: fails in one request, with its cause
        storage.write_atomic(name, lambda f: f.write(b"autockpt write probe\n"))
        written = modified_time(storage, name)
        storage.delete(name)
    except Exception as exc:  # remote backends raise their own types
        raise unwritable(storage, exc, field) from exc
    return written


def unwritable(storage: Storage, exc: BaseException, field: str = "dirpath") -> ConfigError:
    """The ``ConfigError`` for a ``storage`` that cannot be written: an object store's cause
    (:func:`~.storage_errors.diagnose`) in the words ``autockpt inspect`` uses, else the error
    and the fix for its errno."""
    found = diagnose(exc, storage.location, field)
    if found is not None:
        return ConfigError(field, storage.location, f"cannot be written: {found.problem} ({found.detail})", found.fix)
    return ConfigError(field, storage.location, f"cannot be written ({type(exc).__name__}: {exc})", fix_for(exc, field))
