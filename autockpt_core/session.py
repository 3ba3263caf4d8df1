"""The engine both adapters drive: profiler + policy, over a store (storage, mirror, persist
process, writer, locks: :mod:`.checkpoint_store`) and a ledger of costs (:mod:`.run_ledger`).

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
   does the same without the summary (idempotent: for failure paths). A session that is
   garbage-collected unreleased releases its lock then; a process that dies releases it at once.

Preemption: at the step boundary after a signal, ``save(...)`` (unless ``saved_step``
already is this step), then :func:`autockpt_core.emergency.commit_emergency`.

Mirror (``config.mirror``): every committed checkpoint goes to the mirror thread
(:mod:`autockpt_core.persist.mirror`); its lasting failures surface as ``MirrorWriteError``.

Background errors surface as :class:`CheckpointWriteError` from ``step_end``, ``save`` or
``finish``. The clock is injected (``clock``), so the whole engine runs in tests without a
framework or real time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from .checkpoint_store import Check, CheckpointStore
from .config import Config
from .persist import BufferPool, CheckpointRecord, CheckpointWriter, PersistJob, Storage
from .persist.mirror import Mirror
from .persist.persist_mode import PersistModeChoice
from .persist.shared_memory import SharedArena
from .policy import AdjusterSpec, CheckpointPolicy, Decision, Estimates, Profiler
from .policy.adjusters import adjusters_from_config
from .policy.checkpoint_cost import CheckpointCost, CostMeter
from .policy.overhead_meter import Overhead
from .policy.rank_timing import RankTimes
from .run_ledger import RunLedger
from .snapshot import PendingCopy, Snapshot, SnapshotFn
from .summary import RunSummary

__all__ = ["CheckpointSession", "PendingCopy", "Snapshot", "SnapshotFn"]


class CheckpointSession:
    """See the module docstring for the call order and threading.

    ``shared_buffers(arena)``, ``persist_modules``, ``gpu``: the persist process's inputs
    (:class:`~autockpt_core.checkpoint_store.CheckpointStore`; ``config.persist_mode``).

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
        self.clock = clock
        self.profiler = Profiler(config.warmup_steps, config.profile_window)
        self.store = CheckpointStore(
            config, framework=framework, suffix=suffix, buffers=buffers, storage=storage, clock=clock,
            shared_buffers=shared_buffers, persist_modules=persist_modules, gpu=gpu,
            on_persisted=self._on_persisted,
        )  # fmt: skip
        # Explicit adjusters replace the ones the config asks for (adaptive, front_loaded).
        adjusters = interval_adjuster if interval_adjuster is not None else adjusters_from_config(config)
        self.policy = CheckpointPolicy(config, adjusters)
        self.ledger = RunLedger(config.warmup_steps)
        self.last_decision: Decision | None = None
        self._last_step_time: float | None = None
        self._stall_since_last_step = 0.0
        self._loaded_since_last_step = False
        self._last_loss: float | None = None
        self._pending: PendingCopy | None = None
        self._pending_stall: tuple[float, int] | None = None  # (stall so far, nbytes)
        self._cost = CostMeter()
        self._on_cost = on_checkpoint_cost

    # -- the store's parts, as adapters and tests know them -----------------------------------

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

    # -- opening and closing ----------------------------------------------------------------

    def open(self) -> None:
        """:meth:`CheckpointStore.open` (idempotent; ``resume_record()``, ``start()`` and
        ``save()`` call it): ``ConfigError`` or ``DirectoryLockedError`` surface here."""
        self.store.open()

    def close(self) -> None:
        """Wait for the copy in flight and the persist, then release the buffers and the locks;
        re-raise the persist's error, if any (released regardless). Idempotent.

        ``finish()`` calls it. Adapters call it on failure paths that skip ``finish()``.
        """
        try:
            self.before_update()
        finally:
            self.store.close()

    def wait_for_persist_process(self, timeout: float = 60.0) -> bool:
        """Block until the persist process is ready (benchmarks and tests; training thread,
        no persist in flight). Until it is, checkpoints are written by the writer thread.
        True at once without a persist process."""
        return self.store.wait_for_persist_process(timeout)

    # -- resume ---------------------------------------------------------------------------

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

    # -- training loop ----------------------------------------------------------------------

    def start(self, step: int = 0) -> None:
        """Training starts (or resumes) at global step ``step``. Opens the session first."""
        self.open()
        now = self.clock()
        self.ledger.started(now)
        self._last_step_time = now
        self.policy.start(now, step)

    def expect_end(self, step: int | None) -> None:
        """Training ends after ``step`` with a final checkpoint (None: not known, or none);
        see :meth:`CheckpointPolicy.expect_end`."""
        self.policy.expect_end(step)

    def step_end(self, step: int, loss: float | None = None) -> Decision:
        """Record one finished optimizer step and decide whether to checkpoint now."""
        self.store.raise_if_failed()
        now = self.clock()
        writer = self.store.writer
        if self.ledger.start_time is None:  # the adapter did not call start(): begin here
            self.start(step)
        elif self._last_step_time is not None:
            duration = now - self._last_step_time - self._stall_since_last_step
            loaded = self._loaded_since_last_step or writer.busy
            self.profiler.record_iteration(duration, loaded=loaded)
            self.ledger.step(duration, loaded)
            if self._cost.measuring:
                self._cost.add_step(duration)
                if not writer.busy and self._pending is None:
                    self._report_cost()
        self._last_step_time = now
        self._stall_since_last_step = 0.0
        self._loaded_since_last_step = writer.busy
        if loss is not None:
            self._last_loss = float(loss)
        step_loss = self._last_loss if loss is not None else None  # the policy sees this step's loss only
        decision = self.policy.decide(step, now, self.profiler.step_reading(), writer.busy, loss=step_loss)
        self.last_decision = decision
        return decision

    def hook_time(self, seconds: float) -> None:
        """autockpt's own work in the hook of the step :meth:`step_end` just recorded took
        ``seconds`` (its checkpoint's stall not included): every step pays it, so it is counted
        in the measured overhead, and the interval keeps the budget it leaves. Training thread."""
        self.profiler.record_hook(seconds)
        self.ledger.hooks(seconds)

    def preparing(self) -> bool:
        """Whether a one-time preparation for the next snapshot still runs in the background
        (the buffers' prefault): a snapshot taken now would wait for it. Training thread."""
        return self.buffers.prefaulting

    def combine_ranks(self, slowest: RankTimes) -> None:
        """Data parallelism: the slowest rank's figures replace this rank's for the step just ended.

        Call after :meth:`step_end` (same boundary), on the rank that runs the session, with the
        maximum over ranks of each rank's :class:`~autockpt_core.policy.rank_timing.RankTimes`
        for that step. Its step time replaces the iteration just recorded; its blocked time,
        when longer, replaces the newest checkpoint's stall (every rank is held up by a
        checkpoint: the collectives around it and rank 0's copy) and counts in the overhead.
        """
        self.profiler.revise_last_iteration(slowest.step_s)
        self.ledger.revise_last_step(slowest.step_s)
        if slowest.blocked_s > 0:
            self.ledger.stalled(self.profiler.revise_last_stall(slowest.blocked_s))

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
        wait counts as stall. Returns the stall in seconds; the snapshot's one-time ``setup_s``
        is in it and in the overhead, not in the profiler's per-checkpoint stall.
        """
        self.open()
        self.before_update()  # a copy still overlapping must end before its buffers are reused
        start = self.clock()
        store = self.store
        store.writer.wait()
        self._report_cost()  # the previous checkpoint's persist is done: its cost is complete
        store.buffers.begin_round()
        snap = snapshot(store.buffers)
        store.buffers.end_round()
        all_meta = {**(meta or {}), **snap.meta}
        if reason:
            all_meta.setdefault("reason", reason)
        job = PersistJob(
            name=store.free_name(step),
            step=step,
            epoch=epoch,
            framework=self.framework,
            write=snap.write,
            meta=all_meta,
            run=store.run,
            ready=snap.pending.wait if snap.pending is not None else None,
            portable=snap.portable,
            file_set=snap.file_set,
        )
        store.writer.submit(job)
        stall = self.clock() - start
        recurring = max(0.0, stall - snap.setup_s)  # what every checkpoint pays
        if snap.pending is None:
            self.profiler.record_stall(recurring, snap.nbytes)
        else:  # recorded by before_update(), with the wait for the copy added
            self._pending, self._pending_stall = snap.pending, (recurring, snap.nbytes)
        if self._on_cost is not None:
            est = self.profiler.estimates()  # the steps around it are compared with the latest clean ones
            self._cost.begin(snap.mode, recurring, snap.nbytes, est.iter_time_s, est.recent_iter_time_s,
                             est.iter_sd_s)
        self.policy.record_checkpoint(step, self.clock())
        self._stall_since_last_step += stall
        self._loaded_since_last_step = True
        self.ledger.stalled(stall)
        self.ledger.taken(step, job.name, snap.mode)
        return stall

    @property
    def saved_step(self) -> int | None:
        """The step of the newest checkpoint handed to the writer in this session (persisted or not)."""
        return self.ledger.newest_step

    def flush(self) -> None:
        """Block until the in-flight persist is committed, and with a mirror until it is
        uploaded there too; re-raise their errors (training thread)."""
        self.store.flush()

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
            self.ledger.stalled(waited)
        return waited

    def _on_persisted(self, seconds: float) -> None:  # the writer thread, after each commit
        self.profiler.record_persist(seconds)

    def _report_cost(self) -> None:
        """Hand the measured cost of the checkpoint being measured to ``on_checkpoint_cost``."""
        cost = self._cost.finish()
        if cost is not None and self._on_cost is not None:
            self._on_cost(cost)

    def finish(self) -> RunSummary:
        """:meth:`close`, then summarise the run; the wait for the last persist counts as
        blocked time (the training process waits for it before it can end)."""
        start = self.clock()
        try:
            self.close()
        finally:
            if self.ledger.checkpoints:
                self.ledger.waited_at_end(self.clock() - start)
        return self.summary()

    # -- reporting ---------------------------------------------------------------------------

    def estimates(self) -> Estimates:
        return self.profiler.estimates()

    def measured_overhead(self) -> Overhead:
        """The overhead measured so far (:mod:`.policy.overhead_meter`), with its noise."""
        return self.ledger.overhead()

    def metrics(self) -> dict[str, float]:
        """Numbers for the framework's logger: interval, stall, overhead, checkpoint count."""
        store = self.store
        return self.ledger.metrics(self.profiler.estimates(), self.policy.current, store.buffers, store.released_bytes)

    def summary(self) -> RunSummary:
        store, name = self.store, self.ledger.newest_name
        mirror = store.mirror
        return self.ledger.summary(
            self.framework, self.config, self.profiler.estimates(), self.policy.current, self.policy.deferred,
            store.buffers, store.released_bytes,
            newest_path=(store.storage.local_path(name) or name) if name else None,
            mirror=mirror.location if mirror is not None else None,
            mirrored=mirror.mirrored if mirror is not None else 0,
        )  # fmt: skip
