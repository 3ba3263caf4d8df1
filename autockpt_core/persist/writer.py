"""Phase 2 of a checkpoint: persist in the background, commit atomically, then retain.

One persist runs at a time, each in its own (non-daemon) thread, so an interpreter that exits
still finishes the checkpoint it started. Steps of one persist:

1. ``storage.write_atomic``: serialize from the snapshot buffers into a temporary file,
   fsync, rename to the final name (checksum computed while writing);
2. write the manifest with the new record appended (atomic replace);
3. retention: only now, drop records beyond ``keep_last`` from the manifest and then delete
   their files.

A failure in any step leaves the previous checkpoints listed and readable. The exception is
stored and re-raised, once, in the training thread by the next ``raise_if_failed``, ``submit``
or ``wait`` call, wrapped in :class:`CheckpointWriteError`.
"""

from __future__ import annotations

import dataclasses
import errno
import threading
import time
from typing import IO, Any, Callable

from ..errors import CheckpointWriteError
from .manifest import CheckpointRecord, commit_order, read_manifest, write_manifest
from .storage import Storage


@dataclasses.dataclass
class PersistJob:
    """Everything the writer needs; ``write`` serializes the snapshot into a file object."""

    name: str
    step: int
    epoch: int | None
    framework: str
    write: Callable[[IO[bytes]], object]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


PersistCallback = Callable[[CheckpointRecord, float], None]


class CheckpointWriter:
    """Persists jobs one at a time; see the module docstring for the protocol.

    Training-thread API: ``submit``, ``busy``, ``wait``, ``raise_if_failed``, ``close``.
    ``on_persisted(record, seconds)`` is called from the writer thread after each commit.
    """

    def __init__(
        self,
        storage: Storage,
        keep_last: int,
        run_async: bool = True,
        on_persisted: PersistCallback | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self._storage = storage
        self._keep_last = keep_last
        self._async = run_async
        self._on_persisted = on_persisted
        self._clock = clock
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._error_job: PersistJob | None = None
        self._lock = threading.Lock()
        self.last_record: CheckpointRecord | None = None
        self.committed = 0

    @property
    def busy(self) -> bool:
        """True while a persist is running."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, job: PersistJob) -> None:
        """Start persisting ``job`` (in the background when async). Waits for a previous one first."""
        self.wait()
        if self._async:
            self._thread = threading.Thread(target=self._run, args=(job,), name="autockpt-persist")
            self._thread.start()
        else:
            self._run(job)
            self.raise_if_failed()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the in-flight persist finishes; then re-raise its error, if any."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if not thread.is_alive():
                self._thread = None
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        """Re-raise a stored background error in the calling (training) thread, once."""
        with self._lock:
            error, job = self._error, self._error_job
            self._error = self._error_job = None
        if error is not None:
            assert job is not None
            raise CheckpointWriteError(
                f"autockpt could not persist checkpoint {job.name} (step {job.step}) to "
                f"{self._storage.location}: {type(error).__name__}: {error}. "
                f"Older checkpoints are untouched and no partial file is left. Fix: {_hint(error)}."
            ) from error

    def close(self) -> None:
        """Finish the in-flight persist and surface its error."""
        self.wait()

    # -- writer thread --------------------------------------------------------------------

    def _run(self, job: PersistJob) -> None:
        start = self._clock()
        try:
            record = self._persist(job)
        except BaseException as exc:  # stored, re-raised in the training thread
            with self._lock:
                self._error, self._error_job = exc, job
            return
        seconds = self._clock() - start
        self.last_record = record
        self.committed += 1
        if self._on_persisted is not None:
            try:
                self._on_persisted(record, seconds)
            except BaseException as exc:
                with self._lock:
                    self._error, self._error_job = exc, job

    def _persist(self, job: PersistJob) -> CheckpointRecord:
        result = self._storage.write_atomic(job.name, job.write)
        record = CheckpointRecord.from_write(result, job.step, job.epoch, job.framework, job.meta)
        existing = [r for r in read_manifest(self._storage) if r.name != record.name]
        records = existing + [record]
        write_manifest(self._storage, records)  # the new checkpoint is now committed
        if len(records) > self._keep_last:
            ordered = sorted(records, key=commit_order)
            dropped, kept = ordered[: -self._keep_last], ordered[-self._keep_last :]
            write_manifest(self._storage, kept)
            for old in dropped:
                self._storage.delete(old.name)
        return record


def _hint(error: BaseException) -> str:
    """What to do about a persist error, from its errno where it has one."""
    code = getattr(error, "errno", None)
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return "the disk or quota is full; free space there or point dirpath to a larger filesystem"
    if code in (errno.EACCES, errno.EPERM):
        return "this process may not write there; fix the directory's permissions or choose another dirpath"
    if code == errno.EROFS:
        return "the filesystem is read-only; point dirpath to a writable one"
    return "check free space, permissions and the storage backend"
