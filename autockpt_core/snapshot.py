"""What an adapter's snapshot hands the session (phase 1 of a checkpoint): :class:`Snapshot`,
and :class:`PendingCopy`, the part of the copy still in flight (see ``CheckpointSession.save``)."""

from __future__ import annotations

import dataclasses
from typing import IO, Any, Callable, Protocol

from .persist import BufferPool
from .persist.file_set import FileSetWrite
from .persist.persist_process import PortableWrite


class PendingCopy(Protocol):
    """A snapshot copy still running after ``snapshot()`` returned (overlapping the next step).

    ``before_update()`` is called on the training thread right before the next optimizer step
    and orders that step after the copy (a host wait, or on CUDA a stream waiting on an
    event). ``wait()`` is called on the writer thread before serializing and blocks it until
    the copied bytes are in the host buffers. Both may be called more than once.
    """

    def before_update(self) -> None: ...

    def wait(self) -> None: ...


@dataclasses.dataclass
class Snapshot:
    """The result of phase 1: a consistent copy of the state, ready to be serialized.

    ``write(file)`` must only read the snapshot buffers (it runs in the writer thread while
    training continues). ``nbytes`` is the tensor payload size. ``pending``: the part of the
    copy still in flight, if any (see :class:`PendingCopy`); ``mode`` names how the copy
    was made (for the summary, e.g. "sync", "overlap", "device"). ``portable``: the same
    write for the persist process (``Config.persist_mode``); without it the snapshot is
    written by the writer thread. ``file_set``: the checkpoint is a directory of files (a
    sharded model: every rank writes its own, see :meth:`CheckpointSession.staging_directory`);
    ``write`` is then not called. ``setup_s``: the part of phase 1 spent waiting for a one-time
    preparation that later checkpoints do not pay (the read of the state being traced): the run
    paid it, so it counts in the overhead, but not in the per-checkpoint stall the policy uses.
    ``hidden_s``: the part of phase 1 the host spent waiting for an accelerator to finish steps
    queued before the copy, read on the device's clock (the device ran them with or without a
    checkpoint): neither the stall nor the overhead counts it.
    """

    write: Callable[[IO[bytes]], object]
    nbytes: int
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    pending: PendingCopy | None = None
    mode: str | None = None
    portable: PortableWrite | None = None
    file_set: FileSetWrite | None = None
    setup_s: float = 0.0
    hidden_s: float = 0.0


SnapshotFn = Callable[[BufferPool[Any]], Snapshot]
