"""Exception types raised by autockpt.

Every error names what went wrong and, where possible, how to fix it.
"""

from __future__ import annotations


class AutockptError(Exception):
    """Base class of every error autockpt raises on purpose."""


class ConfigError(AutockptError, ValueError):
    """A user-supplied setting is invalid.

    The message names the field, the value given and a fix.
    """

    def __init__(self, field: str, value: object, problem: str, fix: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field}={value!r}: {problem}. Fix: {fix}")


class CheckpointWriteError(AutockptError, RuntimeError):
    """Persisting a checkpoint failed (raised in the training thread).

    The previous checkpoint is left untouched and still the newest valid one.
    """


class CorruptCheckpointError(AutockptError):
    """A checkpoint file does not match the checksum or size in the manifest."""


class ResumeNotExactWarning(UserWarning):
    """A resumed run will not be bitwise identical to an uninterrupted one; the message says why."""
