"""``StoreParts``: the checkpoint store's parts and calls, as a session shows them to adapters.

A base of :class:`~autockpt_core.session.CheckpointSession`, which owns the
:class:`~autockpt_core.checkpoint_store.CheckpointStore` in ``store``; each member forwards to it
(the call order and threading are the session's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .checkpoint_store import Check, CheckpointStore
from .persist import BufferPool, CheckpointRecord, CheckpointWriter, Storage
from .persist.mirror import Mirror
from .persist.persist_mode import PersistModeChoice

__all__ = ["StoreParts"]


class StoreParts:
    """The store's parts (storage, mirror, writer, buffers, ...) and its resume calls."""

    store: CheckpointStore

    @property
    def storage(self) -> Storage:
        return self.store.storage

    @property
    def mirror(self) -> Mirror | None:
        """The second tier (``config.mirror``) committed checkpoints are copied to, if any."""
        return self.store.mirror

    @property
    def writer(self) -> CheckpointWriter:
        return self.store.writer

    @property
    def buffers(self) -> BufferPool[Any]:
        return self.store.buffers

    @property
    def persist_mode(self) -> PersistModeChoice:
        return self.store.persist_mode

    @property
    def run(self) -> str | None:
        """The run this session's records belong to: new, or the resumed checkpoint's."""
        return self.store.run

    @run.setter
    def run(self, value: str | None) -> None:
        self.store.run = value

    @property
    def copied_from_mirror(self) -> bool:
        """``resume_record()`` found its checkpoint in the mirror only and copied it into ``dirpath``."""
        return self.store.copied_from_mirror

    @property
    def process_writes(self) -> int:
        """Checkpoint files the persist process wrote in this session (0 without one)."""
        return self.store.process_writes

    def open(self) -> None:
        """:meth:`CheckpointStore.open` (idempotent; ``resume_record()``, ``start()`` and
        ``save()`` call it): ``ConfigError`` or ``DirectoryLockedError`` surface here."""
        self.store.open()

    def wait_for_persist_process(self, timeout: float = 60.0) -> bool:
        """Block until the persist process is ready (benchmarks and tests; training thread,
        no persist in flight). Until it is, checkpoints are written by the writer thread.
        True at once without a persist process."""
        return self.store.wait_for_persist_process(timeout)

    def resume_record(
        self,
        accept: Callable[[CheckpointRecord], bool] | None = None,
        before: CheckpointRecord | None = None,
        check: Check | None = None,
    ) -> CheckpointRecord | None:
        """The newest checkpoint of this framework that verifies (and ``accept`` takes), if ``config.resume``.

        ``before``: a record this returned earlier; only checkpoints committed before it count.
        ``check``: verifies a ``dirpath`` record in place of reading it here (checkpoints written
        by every process: :class:`~autockpt_core.agreed_check.AgreedCheck`; one read that
        verifies and loads: ``ReadWhileVerifying``, Lightning's ``LoadWhileVerifying``).
        Opens the session first, but leaves the persist process to :meth:`start` (its imports
        would compete with the resume's load for the CPU). A record found makes this session continue its run. With a
        mirror, the newest of either tier; one only the mirror has is copied into ``dirpath``
        first (``autockpt_core.persist.tiers``), so the record is always ``dirpath``'s.
        """
        return self.store.resume_record(accept, before, check)

    def staging_directory(self) -> Path:
        """An empty staging directory in ``dirpath`` for the next multi-file checkpoint (a
        sharded model's; :mod:`autockpt_core.persist.file_set`), which every rank writes into.

        Training thread, before :meth:`save` (whose snapshot returns a ``Snapshot`` with a
        ``file_set`` naming it). Waits for the in-flight persist and raises its error first, so
        no rank starts writing for a checkpoint that then fails to be taken. Local ``dirpath``
        only (``ValueError`` otherwise; adapters refuse such a setup at train start).
        """
        return self.store.staging_directory()

    def path_of(self, record: CheckpointRecord) -> str:
        """Local path of a record's file (raises for remote storage)."""
        return self.store.path_of(record)

    def records(self) -> list[CheckpointRecord]:
        """The manifest's records, oldest first."""
        return self.store.records()
