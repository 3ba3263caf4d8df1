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
3. ``record_steps(steps, ends, losses)`` for the optimizer steps that ended (the driver's hot
   path collects them and hands them over in batches, always before a checkpoint), then
   ``decide(step, now)``, which returns a :class:`Decision`; ``hook_time(seconds, steps)``: what
   autockpt's own hooks took in those steps. ``step_end(step, loss=...)`` does the first two for
   one step that ended now.
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
   directory lock (also when it raises) and returns the :class:`RunSummary`; ``close()``
   without the summary (idempotent: failure paths). An unreleased session releases its lock
   when collected; a process that dies releases it at once.

Preemption: after a signal, ``save(...)`` (unless ``saved_step`` is this step), then
:func:`autockpt_core.emergency.commit_emergency`. Mirror (``config.mirror``): committed
checkpoints go to the mirror thread (:mod:`.persist.mirror`); lasting failures surface as
``MirrorWriteError``. The status file (:mod:`.run_status`) follows decisions and commits.

Background errors surface as :class:`CheckpointWriteError` from ``step_end``, ``save`` or
``finish``. The clock is injected (``clock``), so the whole engine runs in tests without a
framework or real time.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Sequence

from .checkpoint_store import CheckpointStore
from .config import Config
from .persist import BufferPool, PersistJob, Storage
from .persist.shared_memory import SharedArena
from .policy import AdjusterSpec, CheckpointPolicy, Decision, Estimates, Profiler
from .policy.adjusters import adjusters_from_config
from .policy.checkpoint_cost import CheckpointCost, CostMeter
from .policy.overhead_meter import Overhead
from .policy.rank_timing import RankTimes
from .persist import CheckpointRecord
from .run_ledger import RunLedger
from .grace_check import GraceCheck
from .run_status import STATUS_NAME, StatusFile
from .snapshot import PendingCopy, Snapshot, SnapshotFn
from .store_parts import StoreParts
from .summary import RunSummary

__all__ = ["CheckpointSession", "PendingCopy", "Snapshot", "SnapshotFn"]

log = logging.getLogger("autockpt")


class CheckpointSession(StoreParts):
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
        adjusters = interval_adjuster if interval_adjuster is not None else adjusters_from_config(config)  # explicit ones win
        self.policy = CheckpointPolicy(config, adjusters)
        self.ledger = RunLedger(config.warmup_steps)
        self.last_decision: Decision | None = None
        self._last_step_time: float | None = None
        self._stall_since_last_step = 0.0
        self._loaded_since_last_step = False
        self._persist_done_at = -math.inf  # the clock when the newest persist committed (writer thread)
        self._pending: PendingCopy | None = None
        self._pending_stall: tuple[float, int] | None = None  # (stall so far, nbytes)
        self._cost = CostMeter()
        self._on_cost = on_checkpoint_cost
        self.clock_note: str | None = None  # the adapter's: costs read on the host's clock only (summary)
        self._finishing = False  # finish() closes: the status file says "finished", else "failed"
        self.status = StatusFile(self.storage.local_path(STATUS_NAME) if config.status_file else None)
        self._grace = GraceCheck(config.grace_period)

    # -- opening and closing ----------------------------------------------------------------

    def close(self, wait_for_mirror: bool = True) -> None:
        """Wait for the copy in flight and the persist, then release the buffers and the locks;
        re-raise the persist's error, if any (released regardless). Idempotent.

        ``finish()`` calls it. Adapters call it on failure paths that skip ``finish()``.
        ``wait_for_mirror`` False (training failed): the mirror is not waited for.
        """
        try:
            self.before_update()
        finally:
            closed = False
            try:
                self.store.close(wait_for_mirror)
                closed = True
            finally:
                self.status.end("finished" if closed and self._finishing else "failed")

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
        """One optimizer step ended now: :meth:`record_steps` for it, then :meth:`decide`."""
        now = self.clock()
        self.record_steps([step], [now], [loss])
        return self.decide(step, now)

    def record_steps(self, steps: Sequence[int], ends: Sequence[float],
                     losses: Sequence[float | None] | None = None) -> None:  # fmt: skip
        """Optimizer steps ``steps`` ended at ``ends`` (this session's clock, oldest first; the
        driver collects them on its hot path and hands them over in batches, always before a
        checkpoint): each one's duration, net of the checkpoint stall before it, goes to the
        profiler, the ledger and the policy's observers. A step is *loaded* when a snapshot or a
        persist overlapped it: one begun before it, or a persist still running at its end (the
        writer thread notes when each persist committed). ``losses``: each step's training loss
        (None: not read). Training thread; raises a background write error first."""
        self.store.raise_if_failed()
        busy = self.store.writer.busy
        done_at = self._persist_done_at
        if self.ledger.start_time is None:  # the adapter did not call start(): begin at the first
            self.start(steps[0])
            steps, ends = steps[1:], ends[1:]
            losses = losses[1:] if losses is not None else None
        profiler, ledger, cost, policy = self.profiler, self.ledger, self._cost, self.policy
        for i, end in enumerate(ends):
            running = busy or done_at > end  # a persist still ran when this step ended
            if self._last_step_time is not None:
                duration = end - self._last_step_time - self._stall_since_last_step
                loaded = self._loaded_since_last_step or running
                profiler.record_iteration(duration, loaded=loaded)
                ledger.step(duration, loaded)
                if cost.measuring:
                    cost.add_step(duration)
                    if not running and self._pending is None:
                        self._report_cost()
            self._last_step_time = end
            self._stall_since_last_step = 0.0
            self._loaded_since_last_step = running
            loss = losses[i] if losses is not None else None
            policy.observe_step(steps[i], end, running, float(loss) if loss is not None else None)

    def decide(self, step: int, now: float) -> Decision:
        """Whether to checkpoint after ``step`` (the newest step :meth:`record_steps` recorded),
        at ``now``; the decision also says when the next one may be due
        (:attr:`Decision.next_step`, :attr:`Decision.next_time`)."""
        decision = self.policy.decide(step, now, self.profiler.step_reading(), self.store.writer.busy, observe=False)
        self.last_decision = decision
        self.report_status("training", step)
        return decision

    def report_status(self, state: str, step: int) -> None:
        """Bring the status file (:mod:`.run_status`) up to ``state`` at ``step`` (training thread)."""
        if self.status.due(state):  # several processes decide at every step: the estimates only then
            decision = self.last_decision
            self.status.report(state, step, run=self.store.run, estimates=self.profiler.estimates(),
                               next_step=decision.next_step if decision is not None else None)

    def hook_time(self, seconds: float, steps: int = 1) -> None:
        """autockpt's own work in the hooks of the ``steps`` steps :meth:`record_steps` just
        recorded took ``seconds`` in all (their checkpoints' stall not included). Every step pays
        it, so the ledger reports it beside the checkpoints' overhead; the budget is the
        checkpoints' (docs/policy.md, "The budget is for checkpoints"). Training thread."""
        self.profiler.record_hook(seconds, steps)
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
        wait counts as stall. Returns the stall in seconds (the host's); the snapshot's one-time
        ``setup_s`` is in it and in the overhead, not in the profiler's per-checkpoint stall; its
        ``hidden_s`` (a device's queued steps drained) is in neither.
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
        self.report_status("checkpointing", step)
        stall = self.clock() - start
        paid = max(0.0, stall - snap.hidden_s)  # the drain of a device's queue cost the training nothing
        recurring = max(0.0, paid - snap.setup_s)  # what every checkpoint pays
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
        self.ledger.stalled(paid)
        self.ledger.taken(step, job.name, snap.mode)
        self._grace.check(self.profiler.estimates)  # once measured: warns if it would not fit grace_period
        return stall

    @property
    def saved_step(self) -> int | None:
        """The step of the newest checkpoint handed to the writer in this session (persisted or not)."""
        return self.ledger.newest_step

    def flush(self) -> None:
        """Block until the in-flight persist is committed, and with a mirror until it is
        uploaded there too; re-raise their errors (training thread)."""
        self.store.flush()

    @property
    def copy_pending(self) -> bool:
        """Whether a snapshot copy still overlaps the training (:meth:`before_update` waits for it)."""
        return self._pending is not None

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

    def _on_persisted(self, record: CheckpointRecord, seconds: float) -> None:  # the writer thread, after each commit
        self._persist_done_at = self.clock()
        self.profiler.record_persist(seconds)
        self.status.durable(record.step, record.created)

    def _report_cost(self) -> None:  # the measured checkpoint's cost to ``on_checkpoint_cost``
        cost = self._cost.finish()
        if cost is not None and self._on_cost is not None:
            self._on_cost(cost)

    def finish(self, wait_for_mirror: bool = True) -> RunSummary:
        """:meth:`close`, then summarise the run; the wait for the last persist counts as
        blocked time (the training process waits for it before it can end)."""
        start = self.clock()
        self._finishing = True
        try:
            self.close(wait_for_mirror)
        finally:
            if self.ledger.checkpoints:
                self.ledger.waited_at_end(self.clock() - start)
        summary = self.summary()
        warning = summary.hooks_warning()
        if warning is not None:
            log.warning("%s", warning)
        return summary

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
            mirrored=mirror.mirrored if mirror is not None else 0, clock_note=self.clock_note,
        )  # fmt: skip
