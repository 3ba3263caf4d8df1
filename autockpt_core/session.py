"""The engine both adapters drive: profiler + policy + buffers + writer + storage.

Adapters only translate framework hooks into these calls (training thread, in this order):

0. ``open()``, called by ``resume_record()`` and ``start()`` (idempotent): probes ``dirpath``
   with a real write (a ``ConfigError`` naming it, the OS error and the fix, at train start
   rather than at the first checkpoint), takes the directory lock (a second session on the
   same local ``dirpath``, in any process, gets ``DirectoryLockedError`` naming the holder)
   and, when resuming, removes what interrupted writes left there (only under the lock). With
   ``config.mirror`` it probes the mirror too (a ``ConfigError`` naming ``mirror``) and takes
   it: another live run using it gets ``DirectoryLockedError`` (``persist.mirror_claim``).
1. ``resume_record()`` once before training: the newest valid checkpoint to restore, or None.
   With a mirror, the newest of either tier (``autockpt_core.persist.tiers``); one found only
   in the mirror is first copied into ``dirpath``, so the record returned is always local.
   Resuming continues that checkpoint's run (retention counts per framework and run); a
   session that does not resume starts a new run.
2. ``start(step)`` when training starts (``step`` = global step after any restore).
3. ``step_end(step, loss=...)`` after every optimizer step; it returns a :class:`Decision`.
3b. ``combine_ranks(slowest)`` right after it, under data parallelism (the session runs on
   rank 0): the slowest rank's step and checkpoint-blocked times, agreed over the ranks
   (``autockpt_core.policy.rank_timing``), replace rank 0's own in the profiler.
4. ``save(step, epoch, snapshot)`` when the decision says so (or at any time, e.g. on
   preemption): ``snapshot(buffers)`` copies the live state into the session's reusable
   buffers and returns a :class:`Snapshot`; the session measures the stall and hands the
   snapshot to the background writer.
4a. A checkpoint written by several processes (a sharded model: each rank its own files):
   ``staging_directory()`` first, whose path the adapter hands to every rank; the snapshot
   then returns ``Snapshot(file_set=...)``, and the writer commits the directory as one
   record (``autockpt_core.persist.file_set``). Local ``dirpath`` only.
4b. ``before_update()`` right before every optimizer step, when the adapter lets part of
   the copy overlap the next step (``Snapshot.pending``): it makes that step wait for the
   copy (CheckFreq's rule: the weights may not change before the snapshot holds them). The
   wait counts as stall. The writer thread waits for the copy before it serializes.
5. ``finish()`` at the end: waits for the last persist, releases the host buffers and the
   directory lock (also when it raises) and returns the :class:`RunSummary`. ``close()``
   does the same without the summary (idempotent: for failure paths). A session that is garbage-collected unreleased
   releases its lock then; a process that dies releases it at once.

Preemption (``autockpt_core.preemption``, ``autockpt_core.emergency``): at the step boundary
after a signal, ``save(...)`` (unless ``saved_step`` already is this step), then
``commit_emergency``, which returns once that checkpoint is committed (durable and listed in
the manifest) and, with a mirror, uploaded there or given up on after
``config.mirror_preempt_wait``; then exit or continue.

Mirror (``config.mirror``, :class:`~autockpt_core.persist.mirror.Mirror`): every checkpoint
the writer commits is handed to the mirror thread, which uploads the newest one at a time and
retries failed uploads; only ``config.mirror_max_failures`` failures in a row (or
``config.mirror_max_outage`` without a successful upload) surface, as ``MirrorWriteError``,
like the writer's errors; ``finish()`` waits for the last upload.

Background errors surface as :class:`CheckpointWriteError` from ``step_end``, ``save`` or
``finish``. The clock is injected (``clock``), so the whole engine runs in tests without a
framework or real time.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
import warnings
import weakref
from pathlib import Path
from typing import IO, Any, Callable, Protocol

from .config import Config
from .persist import (
    BufferPool,
    CheckpointRecord,
    CheckpointWriter,
    PersistJob,
    Storage,
    find_latest_valid,
    read_manifest,
)
from .persist.directory import open_directory
from .persist.file_set import FileSetWrite, new_staging_directory
from .persist.manifest import warn_skipped
from .persist.mirror import Mirror
from .persist.names import checkpoint_name
from .persist.persist_mode import choose_persist_mode, process_can_write
from .persist.persist_process import PersistProcess, PortableWrite
from .persist.shared_memory import SharedArena, shared_memory_supported
from .persist.storage import configured_storage
from .persist.tiers import committed_before, hydrate, newest_of_tiers
from .policy import AdjusterSpec, CheckpointPolicy, Decision, Estimates, Profiler
from .policy.adjusters import adjusters_from_config
from .policy.checkpoint_cost import CheckpointCost, CostMeter
from .policy.rank_timing import RankTimes
from .summary import RunSummary

log = logging.getLogger("autockpt")


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
    ``write`` is then not called.
    """

    write: Callable[[IO[bytes]], object]
    nbytes: int
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    pending: PendingCopy | None = None
    mode: str | None = None
    portable: PortableWrite | None = None
    file_set: FileSetWrite | None = None


SnapshotFn = Callable[[BufferPool[Any]], Snapshot]


class CheckpointSession:
    """See the module docstring for the call order and threading.

    Persist mode (``config.persist_mode``, chosen here and logged): in "process" mode the
    session owns a :class:`SharedArena`, builds its buffers with ``shared_buffers(arena)``
    (the adapter's pool over shared memory) and starts a persist process at ``open()`` that
    imports ``persist_modules`` ahead of the first checkpoint. ``gpu``: the adapter would pin
    its buffers (then "auto" keeps the writer thread).

    ``on_checkpoint_cost`` (training thread) receives each checkpoint's measured
    :class:`CheckpointCost` once its copy and persist are done (``snapshot_mode="auto"``
    chooses from these; see :mod:`autockpt_core.policy.mode_trial`).
    """

    def __init__(
        self,
        config: Config,
        *,
        framework: str,
        suffix: str,
        buffers: BufferPool[Any] | None = None,
        storage: Storage | None = None,
        clock: Callable[[], float] = time.perf_counter,
        interval_adjuster: AdjusterSpec = None,
        shared_buffers: Callable[[SharedArena], BufferPool[Any]] | None = None,
        persist_modules: tuple[str, ...] = (),
        gpu: bool = False,
        on_checkpoint_cost: Callable[[CheckpointCost], None] | None = None,
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
        self._arena: SharedArena | None = None
        self._process: PersistProcess | None = None
        if self.persist_mode.mode == "process" and shared_buffers is not None:
            self._arena = SharedArena()
            buffers = shared_buffers(self._arena)
            self._process = PersistProcess(self._arena, persist_modules)
            # A session dropped without close(): end the child, close the segments' descriptors.
            weakref.finalize(self, _release_shared, self._process, self._arena)
        self.buffers: BufferPool[Any] = buffers if buffers is not None else BufferPool()
        self.clock = clock
        self.profiler = Profiler(config.warmup_steps, config.profile_window)
        # Explicit adjusters replace the ones the config asks for (adaptive, front_loaded).
        adjusters = interval_adjuster if interval_adjuster is not None else adjusters_from_config(config)
        self.policy = CheckpointPolicy(config, adjusters)
        self.writer = CheckpointWriter(
            self.storage,
            config.keep_last,
            run_async=config.async_persist,
            on_persisted=self._on_persisted,
            clock=clock,
            process=self._process,
            protect=self.mirror.protected if self.mirror is not None else None,
        )
        self.last_decision: Decision | None = None
        self._start_time: float | None = None
        self._last_step_time: float | None = None
        self._stall_since_last_step = 0.0
        self._loaded_since_last_step = False
        self._total_stall = 0.0
        self._checkpoints = 0
        self._newest_step: int | None = None
        self._newest_name: str | None = None
        self._start_step = 0
        self._last_loss: float | None = None
        self._pending: PendingCopy | None = None
        self._pending_stall: tuple[float, int] | None = None  # (stall so far, nbytes)
        self._copy_mode: str | None = None
        self._cost = CostMeter()
        self._on_cost = on_checkpoint_cost
        self.run: str | None = uuid.uuid4().hex
        """The run this session's records belong to: new, or the resumed checkpoint's."""
        self._opened = False
        self._released_bytes = 0  # the host buffers' size when close() released them (for the summary)
        self._release_lock: weakref.finalize | None = None
        self.copied_from_mirror = False
        """``resume_record()`` found its checkpoint in the mirror only and copied it into ``dirpath``."""

    # -- opening and closing ----------------------------------------------------------------

    def open(self) -> None:
        """Lock ``dirpath``, probe it with a real write, clean up after interrupted writes.

        Idempotent; called by ``resume_record()``, ``start()`` and ``save()``. Raises
        ``ConfigError`` (field ``dirpath``) when it cannot be written, ``DirectoryLockedError``
        when another session holds it. Leftovers are removed only with ``config.resume`` and
        only under the lock, so never a live writer's; remote (fsspec) storage has no lock and
        no cleanup. See :mod:`autockpt_core.persist.directory`.
        """
        if self._opened:
            return
        mirror = self.mirror.target if self.mirror is not None else None
        session = weakref.ref(self)  # the claim's heartbeat must not keep the session alive
        held = open_directory(
            self.storage, self.framework, self.suffix, resume=self.config.resume, mirror=mirror,
            mirror_run=lambda: getattr(session(), "run", None),
            mirror_lost=self.mirror.stop if self.mirror is not None else lambda message: None,
        )  # fmt: skip
        self._opened = True
        if self._process is not None:
            self._process.start()
        self._release_lock = weakref.finalize(self, held.release)

    def close(self) -> None:
        """Wait for the in-flight persist, then release the directory lock; re-raise the
        persist's error, if any (the lock is released regardless). Idempotent.

        ``finish()`` calls it. Adapters call it on failure paths that skip ``finish()``.
        """
        try:
            self.before_update()
        finally:
            try:
                try:
                    self.writer.close()
                finally:
                    if self.mirror is not None:
                        self.mirror.close()  # the last checkpoint reaches the mirror before the run ends
                        self.writer.retain_again()  # what was kept for the mirror's sake may go now
            finally:
                self._released_bytes = self.buffers.release_all() or self._released_bytes  # a prefault ends first
                if self._process is not None:
                    self._process.close()  # a later save() starts it again
                if self._release_lock is not None:
                    self._release_lock()  # lock.release(), once
                self._release_lock, self._opened = None, False

    def wait_for_persist_process(self, timeout: float = 60.0) -> bool:
        """Block until the persist process is ready (benchmarks and tests; training thread,
        no persist in flight). Until it is, checkpoints are written by the writer thread.
        True at once without a persist process."""
        self.open()
        return self._process is None or self._process.wait_ready(timeout)

    @property
    def process_writes(self) -> int:
        """Checkpoint files the persist process wrote in this session (0 without one)."""
        return self._process.writes if self._process is not None else 0

    # -- resume ---------------------------------------------------------------------------

    def resume_record(
        self,
        accept: Callable[[CheckpointRecord], bool] | None = None,
        before: CheckpointRecord | None = None,
        check: Callable[[CheckpointRecord], str | None] | None = None,
    ) -> CheckpointRecord | None:
        """The newest checkpoint of this framework that verifies (and ``accept`` takes), if ``config.resume``.

        ``before``: a record this returned earlier; only checkpoints committed before it count.
        ``check``: verifies a ``dirpath`` record in place of reading it here (checkpoints written
        by every process: :class:`~autockpt_core.agreed_check.AgreedCheck`).
        Opens the session first. A record found makes this session continue its run. With a
        mirror, the newest of either tier; one only the mirror has is copied into ``dirpath``
        first (``autockpt_core.persist.tiers``), so the record is always ``dirpath``'s.
        """
        self.open()
        if not self.config.resume:
            return None
        if self.mirror is None:
            if before is not None:
                accept = committed_before(before, accept)
            record = find_latest_valid(self.storage, framework=self.framework, accept=accept, check=check)
        else:
            try:
                mirrored = read_manifest(self.mirror.target)
            except Exception as exc:  # noqa: BLE001 - any backend's error: resume from dirpath, say so
                message = (
                    f"autockpt: the mirror {self.mirror.location} cannot be read ({type(exc).__name__}: {exc}); "
                    f"resuming from the newest checkpoint in {self.storage.location}"
                )
                log.warning(message)
                warnings.warn(message, RuntimeWarning, stacklevel=2)
                if before is not None:
                    accept = committed_before(before, accept)
                record = find_latest_valid(self.storage, framework=self.framework, accept=accept, check=check)
            else:
                record, _ = self._newest_of_tiers(accept, before, mirrored, check)
                self.mirror.learn_twins(read_manifest(self.storage), mirrored)
        if record is not None:
            self.run = record.run
        return record

    def _newest_of_tiers(
        self,
        accept: Callable[[CheckpointRecord], bool] | None,
        before: CheckpointRecord | None,
        mirrored: list[CheckpointRecord],
        check: Callable[[CheckpointRecord], str | None] | None = None,
    ) -> tuple[CheckpointRecord | None, Storage | None]:
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
                return record, tier
            try:
                local = hydrate(self.mirror.target, self.storage, record)
            except (ValueError, FileNotFoundError) as exc:  # the mirror's file is corrupt or gone
                warn_skipped(record, self.mirror.location, exc, stacklevel=3)
                skip.add(record.name)
                continue
            self.copied_from_mirror = True
            return local, self.storage

    def staging_directory(self) -> Path:
        """An empty staging directory in ``dirpath`` for the next multi-file checkpoint (a
        sharded model's; :mod:`autockpt_core.persist.file_set`), which every rank writes into.

        Training thread, before :meth:`save` (whose snapshot returns a ``Snapshot`` with a
        ``file_set`` naming it). Waits for the in-flight persist and raises its error first, so
        no rank starts writing for a checkpoint that then fails to be taken. Local ``dirpath``
        only (``ValueError`` otherwise; adapters refuse such a setup at train start).
        """
        self.open()
        self.writer.wait()
        return new_staging_directory(self.storage)

    def path_of(self, record: CheckpointRecord) -> str:
        """Local path of a record's file (raises for remote storage)."""
        path = self.storage.local_path(record.name)
        if path is None:
            raise ValueError(f"{self.storage.location} is not a local directory")
        return path

    # -- training loop ----------------------------------------------------------------------

    def start(self, step: int = 0) -> None:
        """Training starts (or resumes) at global step ``step``. Opens the session first."""
        self.open()
        now = self.clock()
        self._start_time = now
        self._last_step_time = now
        self._start_step = step
        self.policy.start(now, step)

    def step_end(self, step: int, loss: float | None = None) -> Decision:
        """Record one finished optimizer step and decide whether to checkpoint now."""
        self.writer.raise_if_failed()
        if self.mirror is not None:
            self.mirror.raise_if_failed()
        now = self.clock()
        if self._start_time is None:  # the adapter did not call start(): begin here
            self.start(step)
        elif self._last_step_time is not None:
            duration = now - self._last_step_time - self._stall_since_last_step
            loaded = self._loaded_since_last_step or self.writer.busy
            self.profiler.record_iteration(duration, loaded=loaded)
            if self._cost.measuring:
                self._cost.add_step(duration)
                if not self.writer.busy and self._pending is None:
                    self._report_cost()
        self._last_step_time = now
        self._stall_since_last_step = 0.0
        self._loaded_since_last_step = self.writer.busy
        if loss is not None:
            self._last_loss = float(loss)
        step_loss = self._last_loss if loss is not None else None  # the policy sees this step's loss only
        decision = self.policy.decide(step, now, self.profiler.estimates(), self.writer.busy, loss=step_loss)
        self.last_decision = decision
        return decision

    def combine_ranks(self, slowest: RankTimes) -> None:
        """Data parallelism: the slowest rank's figures replace this rank's for the step just ended.

        Call after :meth:`step_end` (same boundary), on the rank that runs the session, with the
        maximum over ranks of each rank's :class:`~autockpt_core.policy.rank_timing.RankTimes`
        for that step. Its step time replaces the iteration just recorded; its blocked time,
        when longer, replaces the newest checkpoint's stall (every rank is held up by a
        checkpoint: the collectives around it and rank 0's copy) and counts in the overhead.
        """
        self.profiler.revise_last_iteration(slowest.step_s)
        if slowest.blocked_s > 0:
            self._total_stall += self.profiler.revise_last_stall(slowest.blocked_s)

    def save(
        self,
        step: int,
        epoch: int | None,
        snapshot: SnapshotFn,
        meta: dict[str, Any] | None = None,
        reason: str = "",
    ) -> float:
        """Phase 1 on this thread (snapshot, timed as stall), phase 2 handed to the writer.

        Waits for an in-flight persist first (the buffers are about to be overwritten); that
        wait counts as stall. Returns the stall in seconds.
        """
        self.open()
        self.before_update()  # a copy still overlapping must end before its buffers are reused
        start = self.clock()
        self.writer.wait()
        self._report_cost()  # the previous checkpoint's persist is done: its cost is complete
        self.buffers.begin_round()
        snap = snapshot(self.buffers)
        self.buffers.end_round()
        all_meta = {**(meta or {}), **snap.meta}
        if reason:
            all_meta.setdefault("reason", reason)
        job = PersistJob(
            name=self._free_name(step),
            step=step,
            epoch=epoch,
            framework=self.framework,
            write=snap.write,
            meta=all_meta,
            run=self.run,
            ready=snap.pending.wait if snap.pending is not None else None,
            portable=snap.portable,
            file_set=snap.file_set,
        )
        self.writer.submit(job)
        stall = self.clock() - start
        if snap.pending is None:
            self.profiler.record_stall(stall, snap.nbytes)
        else:  # recorded by before_update(), with the wait for the copy added
            self._pending, self._pending_stall = snap.pending, (stall, snap.nbytes)
        self._copy_mode = snap.mode or self._copy_mode
        if self._on_cost is not None:
            est = self.profiler.estimates()  # the steps around it are compared with the latest clean ones
            self._cost.begin(snap.mode, stall, snap.nbytes, est.iter_time_s, est.recent_iter_time_s, est.iter_sd_s)
        self.policy.record_checkpoint(step, self.clock())
        self._stall_since_last_step += stall
        self._loaded_since_last_step = True
        self._total_stall += stall
        self._checkpoints += 1
        self._newest_step = step
        self._newest_name = job.name
        return stall

    @property
    def saved_step(self) -> int | None:
        """The step of the newest checkpoint handed to the writer in this session (persisted or not)."""
        return self._newest_step

    def flush(self) -> None:
        """Block until the in-flight persist is committed, and with a mirror until it is
        uploaded there too; re-raise their errors (training thread)."""
        self.writer.wait()
        if self.mirror is not None:
            self.mirror.wait()

    def before_update(self) -> float:
        """Call right before each optimizer step: waits for a snapshot copy still in flight.

        Training thread. Returns the seconds waited (0 when no copy was pending); they count
        as stall of the checkpoint that started the copy.
        """
        pending = self._pending
        if pending is None:
            return 0.0
        start = self.clock()
        try:
            pending.before_update()
        finally:
            self._pending = None
            waited = self.clock() - start
            stall, nbytes = self._pending_stall or (0.0, 0)
            self._pending_stall = None
            self.profiler.record_stall(stall + waited, nbytes)
            self._cost.add_wait(waited)
            self._stall_since_last_step += waited
            self._total_stall += waited
        return waited

    def _report_cost(self) -> None:
        """Hand the measured cost of the checkpoint being measured to ``on_checkpoint_cost``."""
        cost = self._cost.finish()
        if cost is not None and self._on_cost is not None:
            self._on_cost(cost)

    def _free_name(self, step: int) -> str:
        """The checkpoint name for ``step`` that no existing file has."""
        version = 1
        while self.storage.exists(name := checkpoint_name(step, self.suffix, version)):
            version += 1
        return name

    def _on_persisted(self, record: CheckpointRecord, seconds: float) -> None:
        self.profiler.record_persist(seconds)
        if self.mirror is not None:
            self.mirror.submit(record)

    def finish(self) -> RunSummary:
        """Wait for the last persist, release the directory lock (also when raising), re-raise
        the persist's error if any, and summarise the run."""
        self.close()
        return self.summary()

    # -- reporting ---------------------------------------------------------------------------

    def estimates(self) -> Estimates:
        return self.profiler.estimates()

    def measured_overhead(self) -> float | None:
        """Fraction of wall time since ``start`` the training thread spent blocked by checkpoints."""
        if self._start_time is None:
            return None
        elapsed = self.clock() - self._start_time
        return self._total_stall / elapsed if elapsed > 0 else None

    def metrics(self) -> dict[str, float]:
        """Numbers for the framework's logger: interval, stall, overhead, checkpoint count."""
        est = self.profiler.estimates()
        out: dict[str, float] = {"autockpt/checkpoints": float(self._checkpoints)}
        interval = self.policy.current
        if interval is not None:
            out["autockpt/interval_steps"] = float(interval.steps)
        if est.stall_s is not None:
            out["autockpt/stall_ms"] = est.stall_s * 1e3
        overhead = self.measured_overhead()
        if overhead is not None:
            out["autockpt/overhead_pct"] = overhead * 100.0
        if self.buffers.peak_bytes:
            out["autockpt/buffer_bytes"] = float(self.buffers.total_bytes or self._released_bytes)
            out["autockpt/buffer_peak_bytes"] = float(self.buffers.peak_bytes)
        return out

    def summary(self) -> RunSummary:
        est = self.profiler.estimates()
        interval = self.policy.current
        return RunSummary(
            framework=self.framework,
            checkpoints=self._checkpoints,
            mean_stall_s=(self._total_stall / self._checkpoints) if self._checkpoints else None,
            checkpoint_bytes=est.checkpoint_bytes,
            overhead=self.measured_overhead(),
            budget=self.config.overhead_budget,
            interval_steps=interval.steps if interval is not None else None,
            interval_rule=interval.rule if interval is not None else None,
            newest_step=self._newest_step,
            newest_path=(self.storage.local_path(self._newest_name) or self._newest_name)
            if self._newest_name
            else None,
            persist_s=est.persist_s,
            deferred=self.policy.deferred,
            buffer_bytes=self.buffers.total_bytes or self._released_bytes,
            buffer_peak_bytes=self.buffers.peak_bytes,
            copy_mode=self._copy_mode,
            mirror=self.mirror.location if self.mirror is not None else None,
            mirrored=self.mirror.mirrored if self.mirror is not None else 0,
        )

    def records(self) -> list[CheckpointRecord]:
        """The manifest's records, oldest first."""
        return read_manifest(self.storage)


def _release_shared(process: PersistProcess, arena: SharedArena) -> None:
    try:
        process.close()
    finally:
        arena.close()
