"""``FitDriver``: the checkpoint protocol of one ``fit()``, across processes, for every adapter.

An adapter creates one driver per ``fit()`` and calls it from its hooks; the driver never sees
a Trainer or a Model. What it needs from the framework comes in as values (the step, the loss,
whether a boundary can be resumed exactly) and as callables (``take``: snapshot the state at
this boundary). Only process 0 has a session; every process has a driver, and every process
calls each method below at the same point, because most are collectives when the
:class:`~autockpt_core.policy.process_group.ProcessGroup` has several processes.

Call order (training thread; ``abandon`` from any thread)::

    FitDriver(...)         per fit(), once the session (process 0) and the handler exist
    resume_record(pick)    process 0 picks the checkpoint to resume; every process gets it
    resumed(step)          a resume restored ``step``: no checkpoint of it is taken again
    begin(step)            training starts: the session's clock and this process's step clock
    expect_end(step)       the step training will end after, where the adapter knows it (any time)
    boundary(step)         between steps, not after one (Lightning's train start, Keras' epoch
                           start): a checkpoint deferred to here, then a signal on any process
    outside_step(step)     in work between two steps (each validation batch, the sanity check):
                           a signal is acted on at once (one process; several: at the next step)
    step_end(step, ...)    after every optimizer step: note it; where a checkpoint may be due,
                           decide (process 0), agree, checkpoint or defer, act on a signal
    add_blocked(seconds)   time this process waited for a checkpoint outside the driver
    final(step, ...)       end of training: the final checkpoint, unless the loss is not finite
    finish()               wait for the last persist (its error raised on every process), the
                           summary or "nothing left to train", a late signal agreed
    end(step)              after finish: Preempted for a signal that came after the last step
    abandon()              fit() raised: the in-flight persist completes, its error is logged

The hot path: most ``step_end`` calls only note the step in a preallocated ring
(:mod:`autockpt_core.step_ring`); the statistics and the decision run where a checkpoint may be
due (docs/architecture.md, "The per-step path"). A checkpoint put off (an unclean boundary, a
one-time preparation still running): :mod:`autockpt_core.due`.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
import warnings
from typing import Callable

from .checkpoint_event import CheckpointEvent
from .config import Config
from .due import PREPARATION_WAIT_S, Deferral, Due, PreparationGate
from .emergency import commit_emergency
from .persist import CheckpointRecord
from .persist.failures import unfinished_message
from .fit_records import FitRecords
from .policy.process_group import ProcessGroup
from .policy.rank_timing import RankTimes, StepClock
from .preemption import Preempted, PreemptionHandler, PreemptionRecord, stops
from .preemption_sources import emergency_lead
from .session import CheckpointSession
from .step_ring import Drained, StepRing
from .summary import RunSummary

__all__ = ["FINAL_REASON", "PREPARATION_WAIT_S", "Due", "FitDriver", "FitRecords"]

log = logging.getLogger("autockpt")

FINAL_REASON = "end of training"
_NO_TIMES = RankTimes(0.0, 0.0)  # one process: its step times are not exchanged


def _float_or_none(value: object) -> float | None:
    return float(value) if value is not None else None  # type: ignore[arg-type]


class _NoSignal:
    """Stands in for the preemption handler where signals are off: never a signal."""

    signum: int | None = None


class FitDriver:
    """One ``fit()``'s checkpoints on this process; see the module docstring for the call order.

    ``take(due)`` runs on every process at once (it may use collectives) and returns the
    :class:`CheckpointEvent` on process 0 (None elsewhere, or when it recorded none).
    ``preemption``: the installed handler whose signal is acted on (None: signals are off).
    ``publish``: sends ``session.metrics()`` to the framework's loggers after each checkpoint,
    when the interval changes and at the end (process 0). ``drain(failed)``: before the session
    is finished, waits for work the adapter runs outside it (sharded saves); returns False when
    the session must not be waited for. ``nothing_left``: the message when a resumed run had
    nothing left to train. ``device_busy()`` (training thread, at each hand-over of the noted
    steps): whether the accelerator still has queued work, i.e. the host runs ahead of it and
    the hooks' time is hidden (None: the host's time is the cost, as on a CPU); its ``mark()``, if
    it has one, is called when a checkpoint begins (:class:`autockpt_torch.cuda_api.QueueProbe`). ``preparing()`` (training
    thread, process 0, when a checkpoint is due): whether the adapter's own one-time
    preparation of the snapshot still runs (:class:`~autockpt_core.due.PreparationGate`).
    """

    def __init__(
        self, config: Config, group: ProcessGroup, session: CheckpointSession | None,
        take: Callable[[Due], CheckpointEvent | None], *, save_on_train_end: bool = True,
        preemption: PreemptionHandler | None = None, signals_wait: bool = False,
        publish: Callable[[dict[str, float]], None] | None = None, drain: Callable[[bool], bool] | None = None,
        nothing_left: Callable[[], str] | None = None, device_busy: Callable[[], bool] | None = None,
        preparing: Callable[[], bool] | None = None, loss_of: Callable[[object], float | None] = _float_or_none,
        clock: Callable[[], float] | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.group = group
        self.session = session
        self.preemption = preemption
        self.save_on_train_end = save_on_train_end
        self._take, self._signals_wait = take, signals_wait
        self._publish = publish
        self._drain = drain
        self._nothing_left, self._loss_of = nothing_left, loss_of
        self._device_busy, self._preparing = device_busy, preparing
        # the session's clock: the steps' end times go to it
        self._clock = clock if clock is not None else (session.clock if session is not None else time.perf_counter)
        self._step_clock = StepClock(self._clock)
        self._ring = StepRing()
        self._signals = preemption if preemption is not None else _NoSignal()
        emergency_lead(preemption, session)  # a deadline's lead: the emergency cost the session measures
        self._gate = PreparationGate(self._clock, exact_steps=config.every_n_steps is not None)
        self._finish_lock = threading.Lock()
        self._finished = False
        self._late_signal: int | None = None
        self._deferral: Deferral | None = None
        self._logged_interval: int | None = None
        self._recording_s = 0.0  # the previous step's session.hook_time call
        self.events: list[CheckpointEvent] = []
        self.preempted: PreemptionRecord | None = None
        self.summary: RunSummary | None = None
        self.resumed_from: int | None = None
        self.saved_step: int | None = None  # the newest checkpoint's step (taken or resumed)
        self.trained = False  # an optimizer step ran in this fit
        self.last_loss: object = None  # the adapter's raw value, read (loss_of) only when needed

    @property
    def writes(self) -> bool:
        """Whether this process runs the session (process 0)."""
        return self.session is not None

    def resume_record(
        self, pick: Callable[[CheckpointSession], CheckpointRecord | None] | None = None
    ) -> CheckpointRecord | None:
        """Collective: the checkpoint to resume from, picked on process 0 (default: the newest
        valid one), on every process. An error picking it is raised on every process."""
        record, error = None, None
        if self.session is not None:
            try:
                record = pick(self.session) if pick is not None else self.session.resume_record()
            except Exception as exc:  # a bad manifest, an unreachable store: every process stops
                error = exc
        self.group.raise_if_any_failed(error)
        if self.group.count == 1:
            return record
        text = self.group.text_from(0, json.dumps(record.to_json()) if record is not None else "")
        return CheckpointRecord.from_json(json.loads(text)) if text else None

    def resumed(self, step: int) -> None:
        """A resume restored the checkpoint of ``step``."""
        self.resumed_from = self.saved_step = step

    def begin(self, step: int) -> None:
        """Training starts (or resumes) at ``step``."""
        if self.session is not None:
            self.session.start(step)
        self._step_clock.start()

    def expect_end(self, step: int | None) -> None:
        """The adapter's estimate of the step training ends after (None: not known). With
        ``save_on_train_end`` the policy skips an interval checkpoint that the final one would
        follow before it is durable."""
        if self.session is not None:
            self.session.expect_end(step if self.save_on_train_end else None)

    def boundary(self, step: int) -> None:
        """Collective, between steps: a checkpoint deferred to here, then a signal any process
        received (during validation, the resume or an epoch-end callback) is acted on."""
        self._record_ring()
        deferral, self._deferral = self._deferral, None
        reason = deferral.reason_at(step) if deferral is not None else None
        if reason is not None and step != self.saved_step:
            self._checkpoint(Due(step, reason))
        signum = self.group.settle(None, signum=self._signum()).signum if self.config.signals else None
        if signum is not None:
            self._act_on_signal(step, signum, saved=False)

    def outside_step(self, step: int) -> None:
        """In work between two optimizer steps, ``step`` the last one trained (each validation
        batch, the sanity check): a signal is acted on now, with the checkpoint of ``step`` (the
        adapter's ``take`` holds the state of that step's end). One process only: with several,
        the number of such calls may differ between them, so the signal waits for the next step."""
        if self._signals.signum is not None and self.group.count == 1 and self.config.signals:
            self._record_ring()
            self._act_on_signal(step, self._signals.signum, saved=False)

    def step_end(self, step: int, loss: object = None, unclean: bool | Callable[[], bool] = False,
                 prepare: Callable[[CheckpointSession], None] | None = None) -> None:  # fmt: skip
        """After every optimizer step. The hot path: the step, the clock and the raw ``loss`` go
        into the ring and the call returns, unless a checkpoint may be due at this step or time
        (the last decision's ``next_step``/``next_time``), the ring is full, or a signal came.
        Then, collective: the ring's steps go to the session, process 0 decides, every process
        agrees, and the checkpoint (or its deferral) and a signal follow; a job of several
        processes does this at every step. ``loss`` is read (``loss_of``, which may wait for a
        GPU) only for the front-loaded schedule and by :meth:`final`. ``unclean`` may be a
        function, called only where its answer matters (several processes: every step; one: a
        checkpoint due or a signal). ``prepare(session)`` runs on process 0 before a decision.
        Hook time (each hot-path step's, and the decision's without its checkpoint and the wait
        for the slowest process) goes to the session; none where ``device_busy()`` says the
        accelerator still had queued work at the decision.
        """
        now = self._clock()
        ring = self._ring
        i = ring.count
        ring.steps[i] = step
        ring.ends[i] = now
        ring.losses[i] = loss
        ring.count = i + 1
        if step < ring.check_step and now < ring.check_time and i + 1 < ring.capacity and self._signals.signum is None:
            ring.exits[i] = self._clock()
            return
        ring.exits[i] = now  # this step's hook time is the decision's, measured below
        self._decide(step, now, unclean, prepare)

    def _decide(self, step: int, entry: float, unclean: bool | Callable[[], bool],
                prepare: Callable[[CheckpointSession], None] | None) -> None:  # fmt: skip
        """The collective part of :meth:`step_end` (see there)."""
        self.trained = True
        times = self._step_clock.lap() if self.group.count > 1 else _NO_TIMES
        session = self.session
        save, reason, error, decision, drained = False, "", None, None, None
        if session is None:
            self._ring.drain()
        else:
            try:
                drained = self._record_ring(hooks=False)
                if prepare is not None:
                    prepare(session)
                decision = session.decide(step, entry)
                save, reason = self._gate.check(step, decision.save, decision.reason, self._is_preparing)
            except Exception as exc:  # a background write error: every process stops with it
                error = exc
        signum = self._signum()
        if callable(unclean):
            unclean = unclean() if self.group.count > 1 or save or signum is not None else False
        settle_start = self._clock() if self.group.count > 1 else 0.0
        agreed = self.group.settle(error, save=save, unclean=unclean, signum=signum, times=times)
        # Several processes: the collective also waits for the slowest one's step, which is not
        # this hook's work (without autockpt the next gradient exchange would wait as long).
        settle_s = self._clock() - settle_start if self.group.count > 1 else 0.0
        save, signum = agreed.save, agreed.signum
        if session is not None and self.group.count > 1:
            session.combine_ranks(agreed.slowest)  # the interval suits the slowest process
        deferral, self._deferral = self._deferral, None
        deferred_reason = deferral.reason_at(step) if deferral is not None else None
        if deferred_reason is not None and not save:
            save, reason = True, deferred_reason
        if agreed.unclean and deferral is None and (save or signum is not None) and (
                self._signals_wait or signum is None):  # fmt: skip
            self._deferral = Deferral(step, reason if save else None)
            save, signum = False, None
        checkpoint_s = 0.0
        if save:
            started = self._clock()
            self._checkpoint(Due(step, reason))
            checkpoint_s = self._clock() - started  # counted as the checkpoint's stall
        elif session is not None and decision is not None and decision.interval is not None:
            if decision.interval.steps != self._logged_interval:
                self._send_metrics()
        if session is not None and decision is not None and drained is not None:  # the recording
            # itself is hook work too: it is counted with the next decision
            recording = self._clock()
            self._hand_over_hooks(recording - entry - checkpoint_s - settle_s + self._recording_s
                                  + drained.hook_seconds(), len(drained))  # fmt: skip
            self._recording_s = self._clock() - recording
        # the next look: the step after a checkpoint (its stall and loaded steps are measured one
        # by one), while one is deferred or waits, and every step of a job of several processes
        asked = (decision.next_step, decision.next_time) if decision is not None else (None, None)
        asks = not save and self.group.count == 1 and not (self._deferral or self._gate.waiting)
        self._ring.plan(step, entry, *(asked if asks else (None, None)))
        if signum is not None:
            self._act_on_signal(step, signum, saved=save)

    def _record_ring(self, hooks: bool = True) -> Drained:
        """Hand the steps the hot path collected (and, with ``hooks``, their hook time) to the
        session (process 0): before a decision, a checkpoint outside :meth:`step_end`, the end."""
        drained = self._ring.drain()
        if len(drained) and self.session is not None:
            self.last_loss = drained.losses[-1]
            losses = drained.float_losses(self._loss_of) if self.config.schedule == "front_loaded" else None
            self.session.record_steps(drained.steps, drained.ends, losses)
            if hooks:
                self._hand_over_hooks(drained.hook_seconds(), len(drained))
        return drained

    def _hand_over_hooks(self, seconds: float, steps: int) -> None:
        """The hooks' time of ``steps`` steps to the session (process 0); none where the device
        still runs queued steps: the host's work then cost the training nothing."""
        hidden = self._device_busy is not None and self._device_busy()
        self.session.hook_time(0.0 if hidden else seconds, steps)  # type: ignore[union-attr]

    def add_blocked(self, seconds: float) -> None:
        """This process waited ``seconds`` for a checkpoint outside the driver (an overlapping
        copy before the optimizer update): not counted in its step time."""
        self._step_clock.add_blocked(seconds)

    def final(self, step: int, *, unclean: bool = False) -> None:
        """Collective, at the end of training: the final checkpoint (``save_on_train_end``), or a
        deferred one still due; none when the newest checkpoint holds ``step``, nothing was
        trained, or process 0's last loss is not finite (a warning names the checkpoint kept)."""
        self._record_ring()
        deferral, self._deferral = self._deferral, None
        self._gate.waiting = None  # the final checkpoint follows
        deferred = deferral.reason if deferral is not None else None
        reason = deferred if deferred is not None and not self.save_on_train_end else FINAL_REASON
        take = (self.save_on_train_end or deferred is not None) and self.trained and step != self.saved_step
        loss = self._loss_of(self.last_loss) if take and self.last_loss is not None else None
        if take and self.session is not None and loss is not None and not math.isfinite(loss):
            warnings.warn(
                f"autockpt: no final checkpoint: the last loss is {loss}; the newest checkpoint stays "
                f"step {self.saved_step}",
                RuntimeWarning,
                stacklevel=3,  # the adapter's hook
            )
            take = False
        if self.group.count > 1:
            agreed = self.group.agree(save=take, unclean=unclean)
            take, unclean = agreed.save, agreed.unclean
        if take:
            self._checkpoint(Due(step, reason, final=True, exact=not unclean))

    def finish(self) -> None:
        """Collective, when training ended normally: wait for the last persist and raise its
        error on every process; print the summary line (``verbose``), or say a resumed run had
        nothing left to train; agree on a signal that came after the last step. Once per fit."""
        with self._finish_lock:
            if self._finished:
                return
            self._finished = True
        try:
            self._record_ring()
        except Exception as exc:  # a background write error: raised below, by the session's finish
            log.debug("autockpt: %s", exc)
        error = self._close(failed=False)
        self._late_signal = self.group.settle(error, signum=self._signum()).signum
        if self.session is None:
            return
        if self.trained:
            if self.config.verbose and self.summary is not None:
                print(self.summary.line(), flush=True)
        elif self.resumed_from is not None and self._nothing_left is not None:
            message = self._nothing_left()
            log.info(message)
            if self.config.verbose:
                print(message, flush=True)

    def end(self, step: int) -> None:
        """After :meth:`finish`, at ``step``: a signal that came after the last step ends the run
        with :class:`Preempted` (``on_preempt="exit"``); the trained model is committed."""
        signum = self._late_signal if self._late_signal is not None else self._signum()
        if signum is not None and stops(self.config.on_preempt, signum):
            raise Preempted(signum, step)

    def abandon(self) -> None:
        """``fit()`` raised: the in-flight persist completes and the session is released, without
        waiting for the mirror (what it lacks is logged); an error is logged, never raised (the
        exception that stopped training stays). Any thread; idempotent; nothing after :meth:`finish`."""
        with self._finish_lock:
            if self._finished:
                return
            self._finished = True
        error = self._close(failed=True)
        if error is not None:
            log.error("%s", unfinished_message(error, self.config.dirpath))

    def _close(self, failed: bool) -> BaseException | None:
        """Drain the adapter's own work, then finish the session; the first error, returned."""
        error: BaseException | None = None
        wait = True
        if self._drain is not None:
            try:
                wait = self._drain(failed)
            except Exception as exc:
                error = exc
        if self.session is not None and wait:
            try:
                self.summary = self.session.finish(wait_for_mirror=not failed)  # waits for the last persist
            except Exception as exc:
                error = error or exc
            else:
                self._send_metrics()
        return error

    def _checkpoint(self, due: Due) -> None:
        """Every process: ``take(due)``; a failure on any one is raised on every one."""
        start = self._clock()
        error: BaseException | None = None
        event = None
        getattr(self._device_busy, "mark", lambda: None)()  # a device probe's: where its queue ends now
        try:
            event = self._take(due)
        except Exception as exc:  # a failed copy, the previous persist's error
            error = exc
        self.group.raise_if_any_failed(error)
        self.saved_step = due.step
        if event is not None:
            self.events.append(event)
            self._send_metrics()
        # this process's whole time in the checkpoint, its collectives included: carried in the
        # next agreement, where the slowest process's counts
        self._step_clock.add_blocked(self._clock() - start)

    def _act_on_signal(self, step: int, signum: int, saved: bool) -> None:
        """A signal reached this process or another (agreed): commit a checkpoint of ``step``
        (durable), then raise :class:`Preempted` (``on_preempt="exit"``) or clear it and go on.
        Nothing is taken when the newest checkpoint holds ``step`` or nothing was trained."""
        if not saved and step != self.saved_step and (self.trained or self.resumed_from is not None):
            self._checkpoint(Due(step, f"preempted by {signal.Signals(signum).name}"))
        error: BaseException | None = None
        try:
            self.preempted = commit_emergency(
                self.session, step, signum, on_preempt=self.config.on_preempt, verbose=self.config.verbose,
                received_at=getattr(self._signals, "received_at", None),  # None: another process's signal
                source=getattr(self._signals, "source", None),
            )
        except Exception as exc:  # not committed: every process stops with it
            error = exc
        self.group.raise_if_any_failed(error)
        if stops(self.config.on_preempt, signum):
            raise Preempted(signum, step)
        if self.preemption is not None:
            self.preemption.clear()

    def _send_metrics(self) -> None:
        """``publish(session.metrics())`` (process 0); nothing to compute without a publisher
        (Keras reads the metrics into its epoch logs itself)."""
        if self.session is None or self._publish is None:
            return
        metrics = self.session.metrics()
        interval = metrics.get("autockpt/interval_steps")
        self._logged_interval = int(interval) if interval is not None else None
        self._publish(metrics)

    def _is_preparing(self) -> bool:  # a one-time preparation of the snapshot (the session's or the adapter's)
        session = self.session
        return (session is not None and session.preparing()) or (self._preparing is not None and self._preparing())

    def _signum(self) -> int | None:
        return self._signals.signum
