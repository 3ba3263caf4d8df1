"""Exception types raised by autockpt.

Every error names what went wrong and, where possible, how to fix it.
"""

from __future__ import annotations

from typing import Any


class AutockptError(Exception):
    """Base class of every error autockpt raises on purpose."""


class ConfigError(AutockptError, ValueError):
    """A user-supplied setting is invalid (or, for ``dirpath``, cannot be written).

    The message names the field, the value given and a fix.
    """

    def __init__(self, field: str, value: object, problem: str, fix: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{field}={value!r}: {problem}. Fix: {fix}")


class StorageError(AutockptError, OSError):
    """Object storage could not be used, for a known cause (``autockpt_core.persist.storage_errors``).

    ``location`` is the URL; ``cause`` is ``"credentials"``, ``"endpoint"``, ``"bucket"`` or
    ``"permission"``; ``problem`` says what is wrong, ``detail`` is the original error's type and
    message, ``fix`` what to change. The message is one line holding all of them.
    """

    def __init__(self, location: str, cause: str, problem: str, detail: str, fix: str) -> None:
        self.location = location
        self.cause = cause
        self.problem = problem
        self.detail = detail
        self.fix = fix
        super().__init__(f"{location}: {problem} ({detail}). Fix: {fix}")

    def __reduce__(self) -> tuple[type[StorageError], tuple[str, str, str, str, str]]:
        return type(self), (self.location, self.cause, self.problem, self.detail, self.fix)


class CheckpointWriteError(AutockptError, RuntimeError):
    """Persisting a checkpoint failed (raised in the training thread).

    The message says what was left on disk; older checkpoints are never touched by a failure.
    """


class MirrorWriteError(CheckpointWriteError):
    """Uploads to the mirror kept failing (``Config.mirror_max_failures``/``mirror_max_outage``).

    The checkpoints are committed in ``dirpath``; the message names the mirror's newest one.
    """


class DirectoryLockedError(AutockptError, RuntimeError):
    """Another session (in this or another process) writes checkpoints to the same directory.

    ``holder`` is what the lock file says about that session (host, pid, framework, start
    time), or None when it could not be read; ``dirpath`` is the directory.
    """

    def __init__(self, message: str, dirpath: str, holder: dict[str, Any] | None) -> None:
        self.dirpath = dirpath
        self.holder = holder
        super().__init__(message)


class ResumeNotExactWarning(UserWarning):
    """A resumed run will not be bitwise identical to an uninterrupted one; the message says why."""
