"""Where the background persist runs (``Config.persist_mode``): a pure choice, logged once.

- ``"thread"``: a writer thread in the training process (any storage, any platform);
- ``"process"``: a separate, lower-priority process reading the snapshot buffers through
  shared memory (:mod:`.persist_process`), so the persist's Python never holds the training
  process's GIL; local directories on Linux only;
- ``"auto"``: ``"process"`` where it is possible and the buffers need not be pinned for a GPU,
  else ``"thread"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..config import PERSIST_MODES
from .storage import LocalStorage

__all__ = ["PERSIST_MODES", "PersistModeChoice", "choose_persist_mode", "process_can_write"]


def process_can_write(storage: Any) -> bool:
    """True when a persist process, which writes files with :meth:`LocalStorage.write_atomic`
    itself, writes what ``storage`` would: a :class:`LocalStorage` that keeps that method, or
    one whose ``process_writable`` attribute says so (a subclass that changes how checkpoint
    files are written, and has not said so, keeps the writer thread)."""
    if not isinstance(storage, LocalStorage):
        return False
    declared = getattr(storage, "process_writable", None)
    if declared is not None:
        return bool(declared)
    return type(storage).write_atomic is LocalStorage.write_atomic


@dataclasses.dataclass(frozen=True)
class PersistModeChoice:
    mode: str
    reason: str


def choose_persist_mode(
    requested: str, *, async_persist: bool, local: bool, supported: bool, shareable: bool, gpu: bool
) -> PersistModeChoice:
    """The persist mode for a session.

    ``local``: the storage is a local directory; ``supported``: the platform has shared
    snapshot buffers (:func:`~.shared_memory.shared_memory_supported`); ``shareable``: the
    adapter can put its buffers in shared memory; ``gpu``: the adapter would pin its buffers
    for a GPU (shared buffers are not pinned, so device-to-host copies into them are slower).
    """
    if requested not in PERSIST_MODES:
        raise ValueError(f"unknown persist mode {requested!r}; use one of {', '.join(PERSIST_MODES)}")
    if requested == "thread":
        return PersistModeChoice("thread", "requested")
    missing = (
        "async_persist=False persists on the training thread" if not async_persist
        else "the storage is not a plain local directory" if not local
        else "shared snapshot buffers need Linux (memfd_create)" if not supported
        else "this adapter's buffers cannot be shared" if not shareable
        else None
    )  # fmt: skip
    if missing is not None:
        return PersistModeChoice("thread", f"{requested}: {missing}")
    if requested == "process":
        return PersistModeChoice("process", "requested")
    if gpu:
        return PersistModeChoice("thread", "auto: CUDA is available, so the snapshot buffers are pinned (not shared)")
    return PersistModeChoice("process", "auto: local directory, shared buffers available")
