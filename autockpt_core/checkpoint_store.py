"""Where a session's checkpoints go: ``dirpath``'s storage, the mirror, the persist process and
its shared buffers, the background writer, and the locks that keep other runs out.

:class:`CheckpointStore` is built by ``CheckpointSession`` and used in this order (training
thread): ``open()`` (idempotent; lock and probe ``dirpath``, take the mirror, clean up after
interrupted writes when resuming, start the persist process), ``resume_record()`` once,
then per checkpoint ``wait_for_writer()``, ``free_name(step)`` and ``writer.submit(job)``;
``flush()`` to wait for them, ``commit_emergency(since, on_durable)`` at a preemption;
``close()`` at the end (waits for the writer and the mirror,
releases the host buffers, the persist process and the locks; idempotent). The writer thread
calls ``on_persisted`` (given at construction) for each committed record, then hands the
record to the mirror thread.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable

from .config import Config
from .grace_check import EXIT_MARGIN_S, mirror_wait
from .persist import BufferPool, CheckpointRecord, CheckpointWriter, Storage, find_latest_valid, location_of, read_manifest
from .persist.directory import Held, open_directory
from .persist.file_set import new_staging_directory
from .persist.manifest import warn_skipped
from .persist.mirror import Mirror
from .persist.names import checkpoint_name
from .persist.persist_mode import choose_persist_mode, process_can_write
from .persist.persist_process import PersistProcess
from .persist.shared_memory import SharedArena, shared_memory_supported
from .persist.storage import configured_storage
from .persist.tiers import committed_before, hydrate, newest_of_tiers

log = logging.getLogger("autockpt")

Check = Callable[[CheckpointRecord], "str | None"]


@dataclasses.dataclass(frozen=True)
class EmergencyCommit:
    """What :meth:`CheckpointStore.commit_emergency` left: the newest record committed in
    ``dirpath`` (None: none in this session) and its location, the seconds from the signal to
    its commit, and the mirror's part (``mirrored`` None: no mirror; False: ``mirror_problem``
    says why, ``mirror_newest`` is the mirror's newest record of this session)."""

    record: CheckpointRecord | None
    path: str | None
    durable_s: float
    mirrored: bool | None = None
    mirror_problem: str | None = None
    mirror_newest: CheckpointRecord | None = None


class CheckpointStore:
    """See the module docstring. The arguments are ``CheckpointSession``'s of the same names.

    Persist mode (``config.persist_mode``, chosen here and logged): in "process" mode the
    buffers are ``shared_buffers(arena)`` (the adapter's pool over shared memory) and a persist
    process started at ``open()`` imports ``persist_modules`` ahead of the first checkpoint
    (``resume_record`` opens without starting it: the next ``open()``, at train start, does).
    ``gpu``: the adapter would pin its buffers (then "auto" keeps the writer thread).
    ``on_persisted(record, seconds)`` is called on the writer thread after each commit.
    """

    def __init__(
        self,
        config: Config,
        *,
        framework: str,
        suffix: str,
        buffers: BufferPool[Any] | None,
        storage: Storage | None,
        clock: Callable[[], float],
        shared_buffers: Callable[[SharedArena], BufferPool[Any]] | None,
        persist_modules: tuple[str, ...],
        gpu: bool,
        on_persisted: Callable[[CheckpointRecord, float], None],
    ) -> None:
        self.config = config
        self.framework = framework
        self.suffix = suffix
        self.storage = storage if storage is not None else configured_storage(config.dirpath, config.storage_options)
        self.mirror: Mirror | None = None
        """The second tier (``config.mirror``) committed checkpoints are copied to, if any."""
        if config.mirror is not None:
            keep = config.mirror_keep_last if config.mirror_keep_last is not None else config.keep_last
            target = configured_storage(config.mirror, config.storage_options)
            self.mirror = Mirror(
                self.storage, target, keep, clock=clock,
                max_failures=config.mirror_max_failures, max_outage=config.mirror_max_outage,
                stall_timeout=config.mirror_stall_timeout,
            )  # fmt: skip
        self.persist_mode = choose_persist_mode(
            config.persist_mode,
            async_persist=config.async_persist,
            local=process_can_write(self.storage),
            supported=shared_memory_supported(),
            shareable=shared_buffers is not None,
            gpu=gpu,
        )
        log.info("autockpt: persist in a %s (%s)", self.persist_mode.mode, self.persist_mode.reason)
        self._process: PersistProcess | None = None
        if self.persist_mode.mode == "process" and shared_buffers is not None:
            arena = SharedArena()
            buffers = shared_buffers(arena)
            self._process = PersistProcess(arena, persist_modules)
            # A store dropped without close(): end the child, close the segments' descriptors.
            weakref.finalize(self, _release_shared, self._process, arena)
        self.buffers: BufferPool[Any] = buffers if buffers is not None else BufferPool()
        self._on_persisted = on_persisted
        self.writer = CheckpointWriter(
            self.storage,
            config.keep_last,
            run_async=config.async_persist,
            on_persisted=self._persisted,
            clock=clock,
            process=self._process,
            protect=self.mirror.protected if self.mirror is not None else None,
        )
        self.run: str | None = uuid.uuid4().hex
        """The run the records belong to: new, or the resumed checkpoint's."""
        self.copied_from_mirror = False
        """``resume_record()`` found its checkpoint in the mirror only and copied it into ``dirpath``."""
        self.released_bytes = 0
        """The host buffers' size when ``close()`` released them (for the summary)."""
        self._opened = False
        self._process_started = False
        self._release: weakref.finalize | None = None
        self._held: Held | None = None

    # -- opening and closing ----------------------------------------------------------------

    def open(self, start_process: bool = True) -> None:
        """Lock ``dirpath``, probe it, take the mirror, clean up after interrupted writes (when
        resuming, under the lock), start the persist process (unless ``start_process`` is
        False: the next ``open()`` starts it). Idempotent; see
        :mod:`autockpt_core.persist.directory` for what each step raises."""
        if not self._opened:
            self._open_directory()
        if start_process and not self._process_started:
            self._process_started = True
            if self._process is not None:
                self._process.start()

    def _open_directory(self) -> None:
        mirror = self.mirror.target if self.mirror is not None else None
        store = weakref.ref(self)  # the claim's heartbeat must not keep the store alive
        held = open_directory(
            self.storage, self.framework, self.suffix, resume=self.config.resume, mirror=mirror,
            mirror_run=lambda: getattr(store(), "run", None),
            mirror_lost=self.mirror.stop if self.mirror is not None else lambda message: None,
            mirror_takeover=self.config.mirror_takeover,
        )  # fmt: skip
        self._opened = True
        self._release = weakref.finalize(self, held.release)
        self._held = held

    def close(self, wait_for_mirror: bool = True) -> None:
        """Wait for the writer and the mirror (re-raising their errors), then release the host
        buffers, the persist process and the locks (also when raising). Idempotent.
        ``wait_for_mirror`` False (training failed): the mirror is left, what it lacks logged."""
        try:
            try:
                self.writer.close()
            finally:
                if self.mirror is not None and wait_for_mirror:
                    self.mirror.close()  # the last checkpoint reaches the mirror before the run ends
                    self.writer.retain_again()  # what was kept for the mirror's sake may go now
                elif self.mirror is not None and (lacks := self.mirror.leave()) is not None:
                    log.warning(lacks)
        finally:
            self.released_bytes = self.buffers.release_all() or self.released_bytes  # a prefault ends first
            if self._process is not None:
                self._process.close()  # a later open() starts it again
            if self._release is not None:
                self._release()  # held.release(), once
            self._release, self._held, self._opened, self._process_started = None, None, False, False

    def commit_emergency(self, since: float, on_durable: Callable[[float], None]) -> EmergencyCommit:
        """A preemption (training thread): block until the checkpoint in flight is durable and
        listed in ``dirpath``'s manifest, call ``on_durable(seconds since the signal)``, then give
        the mirror what is left of ``grace_period`` (:func:`~.grace_check.mirror_wait`: an older
        upload in flight is abandoned so this one goes first; best effort, nothing raised), and
        :meth:`close` the rest for the mirror's claim (half the exit margin kept). ``since``:
        ``time.monotonic()`` when the signal (or notice, or deadline) asked.

        Raises the persist's :class:`~autockpt_core.CheckpointWriteError` only if the checkpoint
        is not committed in ``dirpath`` (the previous one then stays the newest)."""
        self.writer.wait()
        durable_s = time.monotonic() - since
        on_durable(durable_s)
        record = self.writer.last_record
        done = EmergencyCommit(record, location_of(self.storage, record.name) if record else None, durable_s)
        if record is None or self.mirror is None:
            return done
        config = self.config
        wait = mirror_wait(config.grace_period, config.mirror_preempt_wait, time.monotonic() - since)
        delivery = self.mirror.deliver(record, wait)
        if self._held is not None:  # the claim's removal at close() gets what is left of the window
            self._held.exit_within(config.grace_period - (time.monotonic() - since) - EXIT_MARGIN_S / 2)
        return dataclasses.replace(done, mirrored=delivery.uploaded, mirror_problem=delivery.problem,
                                   mirror_newest=self.mirror.last_record)  # fmt: skip

    def wait_for_persist_process(self, timeout: float = 60.0) -> bool:
        """Block until the persist process is ready; True at once without one."""
        self.open()
        return self._process is None or self._process.wait_ready(timeout)

    @property
    def process_writes(self) -> int:
        """Checkpoint files the persist process wrote (0 without one)."""
        return self._process.writes if self._process is not None else 0

    # -- resume ---------------------------------------------------------------------------

    def resume_record(
        self,
        accept: Callable[[CheckpointRecord], bool] | None = None,
        before: CheckpointRecord | None = None,
        check: Check | None = None,
    ) -> CheckpointRecord | None:
        """See ``CheckpointSession.resume_record``."""
        self.open(start_process=False)  # its imports would compete with the resume's load for the CPU
        if not self.config.resume:
            return None
        def newest_in_dirpath() -> CheckpointRecord | None:
            taken = committed_before(before, accept) if before is not None else accept
            return find_latest_valid(self.storage, framework=self.framework, accept=taken, check=check)

        if self.mirror is None:
            record = newest_in_dirpath()
        else:
            try:
                mirrored = read_manifest(self.mirror.target)
            except Exception as exc:  # noqa: BLE001 - any backend's error: resume from dirpath, say so
                message = (
                    f"autockpt: the mirror {self.mirror.location} cannot be read ({type(exc).__name__}: {exc}); "
                    f"resuming from the newest checkpoint in {self.storage.location}"
                )
                log.warning(message)
                warnings.warn(message, RuntimeWarning, stacklevel=3)
                record = newest_in_dirpath()
            else:
                record = self._newest_of_tiers(accept, before, mirrored, check)
        if record is not None:
            self.run = record.run
        return record

    def _newest_of_tiers(
        self,
        accept: Callable[[CheckpointRecord], bool] | None,
        before: CheckpointRecord | None,
        mirrored: list[CheckpointRecord],
        check: Check | None,
    ) -> CheckpointRecord | None:
        """:func:`newest_of_tiers` over the mirror's records ``mirrored``; a mirror checkpoint
        that wins is copied into ``dirpath`` (checked on the way; a corrupt or missing one is
        skipped with a warning for the next)."""
        assert self.mirror is not None
        skip: set[str] = set()
        while True:
            record, tier = newest_of_tiers(
                self.storage, self.mirror.target, self.framework, accept, before, skip, mirrored, check
            )
            if record is None or tier is not self.mirror.target:
                return record
            try:
                local = hydrate(self.mirror.target, self.storage, record)
            except (ValueError, FileNotFoundError) as exc:  # the mirror's file is corrupt or gone
                warn_skipped(record, self.mirror.location, exc, stacklevel=4)
                skip.add(record.name)
                continue
            self.copied_from_mirror = True
            return local

    # -- writing ----------------------------------------------------------------------------

    def staging_directory(self) -> Path:
        """See ``CheckpointSession.staging_directory``."""
        self.open()
        self.writer.wait()
        return new_staging_directory(self.storage)

    def free_name(self, step: int) -> str:
        """The checkpoint name for ``step`` that no existing file has."""
        version = 1
        while self.storage.exists(name := checkpoint_name(step, self.suffix, version)):
            version += 1
        return name

    def flush(self) -> None:
        """Block until the in-flight persist is committed, and with a mirror uploaded there
        too; re-raise their errors (training thread)."""
        self.writer.wait()
        if self.mirror is not None:
            self.mirror.wait()

    def raise_if_failed(self) -> None:
        """Re-raise a background error of the writer or the mirror (training thread)."""
        self.writer.raise_if_failed()
        if self.mirror is not None:
            self.mirror.raise_if_failed()

    def path_of(self, record: CheckpointRecord) -> str:
        """Local path of a record's file (raises for remote storage)."""
        path = self.storage.local_path(record.name)
        if path is None:
            raise ValueError(f"{self.storage.location} is not a local directory")
        return path

    def records(self) -> list[CheckpointRecord]:
        """The manifest's records, oldest first."""
        return read_manifest(self.storage)

    def _persisted(self, record: CheckpointRecord, seconds: float) -> None:
        self._on_persisted(record, seconds)
        if self.mirror is not None:
            self.mirror.submit(record)


def _release_shared(process: PersistProcess, arena: SharedArena) -> None:
    try:
        process.close()
    finally:
        arena.close()
