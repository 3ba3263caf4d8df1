"""Phase 2 of a checkpoint: persist in the background, commit atomically, then retain.

One persist runs at a time, each in its own (non-daemon) thread, so an interpreter that exits
still finishes the checkpoint it started. Steps of one persist:

1. ``storage.write_atomic``: serialize from the snapshot buffers into a temporary file,
   fsync, rename to the final name (checksum computed while writing);
2. commit: write the manifest with the new record appended (atomic replace), its ``seq`` one
   more than the largest in the manifest;
3. retention (:mod:`.retention`): only now, drop the records of the same framework and run
   beyond ``keep_last`` from the manifest, then delete their files. Other runs' records are
   never dropped.

A failure in step 1 or 2 leaves the previous checkpoints listed and readable, and no file of
the new one (a file renamed into place whose manifest write failed is removed; if that fails
too, the message names it). The failure is stored and raised, once, in the training thread
by the next ``raise_if_failed``, ``submit`` or ``wait`` call, as
:class:`CheckpointWriteError` whose message says what was left (see :mod:`.failures`). A
failure in step 3 is not an error (the new checkpoint is committed): it is logged at once and
issued as a ``RuntimeWarning`` in the training thread by the same calls.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import warnings
from collections.abc import Collection
from typing import IO, Any, Callable

from ..errors import CheckpointWriteError
from .failures import PersistFailure
from .file_set import FileSetWrite, commit_file_set
from .manifest import CheckpointRecord, next_seq, read_manifest, write_manifest
from .persist_process import PersistProcess, PersistProcessError, PortableWrite
from .retention import retain
from .storage import LocalStorage, NotDurableError, Storage, WriteResult, location_of

log = logging.getLogger("autockpt")


@dataclasses.dataclass
class PersistJob:
    """Everything the writer needs; ``write`` serializes the snapshot into a file object.

    ``run``: the id of the run the record belongs to (retention counts per framework and run).
    ``ready``: called first, in the writer thread (waits for a snapshot copy still in flight).
    ``portable``: the same write as something the persist process can run (used when the
    writer has one; else ``write`` runs in the writer thread). ``file_set``: the checkpoint is
    a directory of files (a sharded model's) instead of one file: ``write`` is not called,
    :func:`.file_set.commit_file_set` fills, verifies and renames the staging directory.
    """

    name: str
    step: int
    epoch: int | None
    framework: str
    write: Callable[[IO[bytes]], object]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    run: str | None = None
    ready: Callable[[], None] | None = None
    portable: PortableWrite | None = None
    file_set: FileSetWrite | None = None


PersistCallback = Callable[[CheckpointRecord, float], None]


PROCESS_FAILURES_BEFORE_OFF = 3
"""Failed writes in a row after which the persist process is turned off for the session."""

class _Failed(Exception):
    """Carries a :class:`PersistFailure` out of ``_persist`` (writer thread only)."""

    def __init__(self, failure: PersistFailure) -> None:
        super().__init__(failure.stage)
        self.failure = failure


class CheckpointWriter:
    """Persists jobs one at a time; see the module docstring for the protocol.

    Training-thread API: ``submit``, ``busy``, ``wait``, ``raise_if_failed``, ``close``.
    ``on_persisted(record, seconds)`` is called from the writer thread after each commit.
    ``clock`` times the persist; ``wall_clock`` stamps ``created`` (information only: records
    are ordered by their ``seq``). ``process``: a persist process that writes the file of
    jobs that have a ``portable`` write once it is ready (local storage only; until then, this
    thread writes them); the commit stays here.
    """

    def __init__(
        self,
        storage: Storage,
        keep_last: int,
        run_async: bool = True,
        on_persisted: PersistCallback | None = None,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        process: PersistProcess | None = None,
        protect: Callable[[], Collection[str]] | None = None,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self._storage = storage
        self._keep_last = keep_last
        self._async = run_async
        self._on_persisted = on_persisted
        self._clock = clock
        self._wall_clock = wall_clock
        self._process = process if isinstance(storage, LocalStorage) else None
        self._process_failures = 0  # the persist process's failed writes in a row
        self._protect = protect
        self._thread: threading.Thread | None = None
        self._failure: PersistFailure | None = None
        self._warnings: list[str] = []
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
        """Issue stored retention warnings, then raise a stored background error; each once."""
        with self._lock:
            failure, self._failure = self._failure, None
            pending, self._warnings = self._warnings, []
        for message in pending:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        if failure is not None:
            if not isinstance(failure.error, Exception):
                # Ctrl-C (KeyboardInterrupt) or SystemExit during a synchronous persist is not a
                # storage error: it goes on as itself, after the partial file was removed.
                raise failure.error
            raise CheckpointWriteError(failure.message()) from failure.error

    def close(self) -> None:
        """Finish the in-flight persist and surface its error."""
        self.wait()

    def retain_again(self) -> None:
        """Apply retention to the newest committed checkpoint once more (training thread, no
        persist in flight): what ``protect`` spared at its commit may be droppable now (the
        session calls it at the end, once the mirror has its last upload)."""
        record = self.last_record
        if record is None:
            return
        try:
            records = read_manifest(self._storage)
        except Exception as exc:  # noqa: BLE001 - retention never fails a committed run
            log.warning("autockpt: retention in %s skipped: %s", self._storage.location, exc)
            return
        if any(r.name == record.name for r in records):
            self._retain(record, records)

    # -- writer thread --------------------------------------------------------------------

    def _run(self, job: PersistJob) -> None:
        start = self._clock()
        try:
            record = self._persist(job)
        except _Failed as failed:  # stored, raised in the training thread
            self._store(failed.failure)
            return
        seconds = self._clock() - start
        self.last_record = record
        self.committed += 1
        if self._on_persisted is not None:
            try:
                self._on_persisted(record, seconds)
            except BaseException as exc:
                self._store(self._failure_of("callback", job, exc))

    def _persist(self, job: PersistJob) -> CheckpointRecord:
        stage = "write"
        try:
            if job.ready is not None:
                job.ready()
            if job.file_set is not None:
                result = commit_file_set(self._storage, job.file_set, job.name)
            else:
                result = self._write_file(job)
            stage = "commit"
            records = read_manifest(self._storage)
            record = CheckpointRecord.from_write(
                result, job.step, job.epoch, job.framework, job.meta,
                created=self._wall_clock(), seq=next_seq(records), run=job.run,
            )  # fmt: skip
            records = [r for r in records if r.name != record.name] + [record]
            write_manifest(self._storage, records)  # the new checkpoint is now committed
        except BaseException as exc:
            raise _Failed(self._undo(stage, job, exc)) from exc
        self._retain(record, records)
        return record

    def _write_file(self, job: PersistJob) -> WriteResult:
        """Step 1 in the persist process when it is ready and can run ``job``'s write, else here.

        A write the process fails (it died, it could not load the arguments, any error of
        its own) is written here instead, with a warning: the process never costs a checkpoint
        the writer thread would have written. After :data:`PROCESS_FAILURES_BEFORE_OFF`
        failures in a row the process is turned off and this thread writes every later one
        (a transient failure does not cost the session its process). An error of this thread's
        own write is the checkpoint's failure.
        """
        process = self._process
        for_process = None
        if process is not None and job.portable is not None and process.ready():
            for_process = job.portable.for_process_of(process.arena)
        if for_process is None:
            return self._storage.write_atomic(job.name, job.write)
        assert process is not None and isinstance(self._storage, LocalStorage)
        try:
            result = process.write_atomic(self._storage, job.name, for_process)
        except Exception as exc:  # noqa: BLE001 - any failure of the process: this thread writes
            if isinstance(exc, PersistProcessError):  # it died mid-write: its temporary file may be left
                try:
                    self._storage.cleanup_temporaries()  # nothing else writes here: the session holds the lock
                except OSError as removal:
                    log.warning("autockpt: could not remove the persist process's temporary file (%s)", removal)
            result = self._storage.write_atomic(job.name, job.write)
            self._process_failures += 1
            if self._process_failures >= PROCESS_FAILURES_BEFORE_OFF:
                process.disable()
                after = (f"after {self._process_failures} failures in a row it is turned off: this thread "
                         "writes every later checkpoint of this session")  # fmt: skip
            else:
                after = (f"failure {self._process_failures} in a row; the process is turned off after "
                         f"{PROCESS_FAILURES_BEFORE_OFF}")  # fmt: skip
            self._warn(
                f"autockpt: the persist process failed writing {job.name} ({type(exc).__name__}: {exc}); "
                f"the writer thread wrote it instead ({after})"
            )
            return result
        self._process_failures = 0
        return result

    def _undo(self, stage: str, job: PersistJob, error: BaseException) -> PersistFailure:
        """Remove the new file where it is in place but not listed; say what is left."""
        if stage == "commit" and isinstance(error, NotDurableError):
            return self._failure_of("durable", job, error)  # listed: it stays
        if stage == "write" and not isinstance(error, NotDurableError):
            # write_atomic removed its temporary file (commit_file_set its staging directory)
            return self._failure_of(stage, job, error)
        try:
            self._storage.delete(job.name)
        except Exception as removal:  # noqa: BLE001 - any backend's error: reported in the message
            return self._failure_of(stage, job, error, location_of(self._storage, job.name), removal)
        return self._failure_of(stage, job, error)

    def _retain(self, record: CheckpointRecord, records: list[CheckpointRecord]) -> None:
        """Drop this framework's and run's records beyond ``keep_last``, sparing what ``protect``
        names; a failure only warns."""
        keep = self._protect() if self._protect is not None else ()
        for message in retain(self._storage, record, records, self._keep_last, keep):
            self._warn(message)

    def _failure_of(
        self,
        stage: str,
        job: PersistJob,
        error: BaseException,
        leftover: str | None = None,
        removal_error: BaseException | None = None,
    ) -> PersistFailure:
        return PersistFailure(stage, error, job.name, job.step, self._storage.location, leftover, removal_error)

    def _store(self, failure: PersistFailure) -> None:
        with self._lock:
            self._failure = failure

    def _warn(self, message: str) -> None:
        log.warning(message)
        with self._lock:
            self._warnings.append(message)
