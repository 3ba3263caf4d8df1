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
    step_end(step, ...)    after every optimizer step: decide (process 0), agree, checkpoint or
                           defer, act on a signal
    add_blocked(seconds)   time this process waited for a checkpoint outside the driver
    final(step, ...)       end of training: the final checkpoint, unless the loss is not finite
    finish()               wait for the last persist (its error raised on every process), the
                           summary or "nothing left to train", a late signal agreed
    end(step)              after finish: Preempted for a signal that came after the last step
    abandon()              fit() raised: the in-flight persist completes, its error is logged

Deferral: a checkpoint due at a boundary the adapter reports ``unclean`` (one a resumed run
cannot continue from exactly) is taken at the next boundary, once: Lightning's next step end,
Keras' next epoch start. With ``signals_wait=True`` a signal there waits too (Lightning: the
run is stopped at the next clean step); otherwise a signal checkpoints at once.

Preparation: a checkpoint the policy calls due while a one-time preparation of the snapshot
still runs in the background (the session's buffer prefault, the adapter's ``preparing``, e.g.
TensorFlow tracing its batched read) would wait for the rest of it on the training thread. It
is taken at the first step end after the preparation finished instead, at most
``PREPARATION_WAIT_S`` of training later (then it waits). A signal's checkpoint, the final one
and those of ``every_n_steps`` (exact steps asked for) are not put off.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import signal
import threading
import time
import warnings
from typing import Callable, SupportsFloat

from .checkpoint_event import CheckpointEvent
from .config import Config
from .emergency import commit_emergency
from .persist import CheckpointRecord
from .persist.failures import unfinished_message
from .policy.process_group import ProcessGroup
from .policy.rank_timing import StepClock
from .preemption import Preempted, PreemptionHandler, PreemptionRecord
from .session import CheckpointSession
from .summary import RunSummary

__all__ = ["FINAL_REASON", "PREPARATION_WAIT_S", "Due", "FitDriver", "FitRecords"]

log = logging.getLogger("autockpt")

FINAL_REASON = "end of training"
PREPARATION_WAIT_S = 30.0  # the longest a due checkpoint waits for a one-time preparation


@dataclasses.dataclass(frozen=True)
class Due:
    """A checkpoint the adapter's ``take`` is to take now, of the state at this boundary.

    ``reason``: process 0's (it decides; empty on the other processes, except after a signal);
    ``final``: the end-of-training checkpoint; ``exact``: False when a run cannot continue from
    this boundary exactly (a final checkpoint at an unclean boundary; recorded in its meta).
    """

    step: int
    reason: str
    final: bool = False
    exact: bool = True


@dataclasses.dataclass(frozen=True)
class _Deferral:
    step: int
    reason: str | None  # None: only a signal was put off; "" on the processes that do not decide

    def reason_at(self, step: int) -> str | None:
        if not self.reason or step == self.step:
            return self.reason
        return f"{self.reason} (deferred from step {self.step})"


@dataclasses.dataclass(frozen=True)
class _Waiting:
    """A due checkpoint put off while a one-time preparation runs (process 0)."""

    step: int
    reason: str
    since: float  # the driver's clock when it was first due

    def reason_at(self, step: int) -> str:
        if step == self.step:
            return self.reason
        return f"{self.reason} (deferred from step {self.step}: a one-time preparation was still running)"


class FitDriver:
    """One ``fit()``'s checkpoints on this process; see the module docstring for the call order.

    ``take(due)`` runs on every process at once (it may use collectives) and returns the
    :class:`CheckpointEvent` on process 0 (None elsewhere, or when it recorded none).
    ``preemption``: the installed handler whose signal is acted on (None: signals are off).
    ``publish``: sends ``session.metrics()`` to the framework's loggers after each checkpoint,
    when the interval changes and at the end (process 0). ``drain(failed)``: before the session
    is finished, waits for work the adapter runs outside it (sharded saves); returns False when
    the session must not be waited for. ``nothing_left``: the message when a resumed run had
    nothing left to train. ``device_busy()`` (training thread, end of each step's hook): whether
    the accelerator still has queued work, i.e. the host runs ahead of it and the hook's time
    is hidden (None: the host's time is the cost, as on a CPU). ``preparing()`` (training
    thread, process 0, when a checkpoint is due): whether the adapter's own one-time
    preparation of the snapshot still runs (see "Preparation" in the module docstring).
    """

    def __init__(
        self,
        config: Config,
        group: ProcessGroup,
        session: CheckpointSession | None,
        take: Callable[[Due], CheckpointEvent | None],
        *,
        save_on_train_end: bool = True,
        preemption: PreemptionHandler | None = None,
        signals_wait: bool = False,
        publish: Callable[[dict[str, float]], None] | None = None,
        drain: Callable[[bool], bool] | None = None,
        nothing_left: Callable[[], str] | None = None,
        device_busy: Callable[[], bool] | None = None,
        preparing: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.group = group
        self.session = session
        self.preemption = preemption
        self.save_on_train_end = save_on_train_end
        self._take = take
        self._signals_wait = signals_wait
        self._publish = publish
        self._drain = drain
        self._nothing_left = nothing_left
        self._device_busy = device_busy
        self._preparing = preparing
        self._clock = clock
        self._step_clock = StepClock(clock)
        self._finish_lock = threading.Lock()
        self._finished = False
        self._late_signal: int | None = None
        self._deferral: _Deferral | None = None
        self._waiting: _Waiting | None = None
        self._logged_interval: int | None = None
        self._recording_s = 0.0  # the previous step's session.hook_time call
        self.events: list[CheckpointEvent] = []
        self.preempted: PreemptionRecord | None = None
        self.summary: RunSummary | None = None
        self.resumed_from: int | None = None
        self.saved_step: int | None = None  # the newest checkpoint's step (taken or resumed)
        self.trained = False  # an optimizer step ran in this fit
        self.last_loss: SupportsFloat | None = None  # process 0, not read on the host until needed

    @property
    def writes(self) -> bool:
        """Whether this process runs the session (process 0)."""
        return self.session is not None

    # -- start --------------------------------------------------------------------------------

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

    # -- boundaries ---------------------------------------------------------------------------

    def boundary(self, step: int) -> None:
        """Collective, between steps: a checkpoint deferred to here, then a signal any process
        received (during validation, the resume or an epoch-end callback) is acted on."""
        deferral, self._deferral = self._deferral, None
        reason = deferral.reason_at(step) if deferral is not None else None
        if reason is not None and step != self.saved_step:
            self._checkpoint(Due(step, reason))
        if not self.config.signals:
            return
        signum = self.group.settle(None, signum=self._signum()).signum
        if signum is not None:
            self._act_on_signal(step, signum, saved=False)

    def step_end(self, step: int, *, loss: SupportsFloat | None = None,
                 unclean: bool | Callable[[], bool] = False,
                 prepare: Callable[[CheckpointSession], None] | None = None) -> None:  # fmt: skip
        """Collective, after every optimizer step: process 0 decides, every process agrees, then
        the checkpoint (or its deferral) and a signal any process received. On process 0 the
        time this call took, its checkpoint and (several processes) the collective aside, goes
        to the session as the step's hook time (the time of handing it over goes with the next
        step's); 0 where ``device_busy`` says the accelerator still had queued work when it
        ended (the host runs ahead of the device, so the training did not wait for it).

        ``loss`` and ``unclean`` are read on process 0 only. ``unclean`` may be a function, called
        (training thread, this step) only where its answer matters: at every step of a job of
        several processes; in a job of one, when a checkpoint is due or a signal came.
        ``prepare(session)`` runs on process 0 before the decision (buffer allocation), its
        error raised on every process. ``loss`` may be a device tensor: it is read on the host
        (``float``, which may wait for a GPU) only where the policy needs every step's loss (the
        front-loaded schedule fits the loss curve), and the last one by :meth:`final`.
        """
        entry = self._clock()
        self.trained = True
        times = self._step_clock.lap()
        session = self.session
        save, reason, error, decision = False, "", None, None
        if session is not None:
            self.last_loss = loss
            try:
                if prepare is not None:
                    prepare(session)
                every_step = loss is not None and self.config.schedule == "front_loaded"
                decision = session.step_end(step, loss=float(loss) if every_step else None)
                save, reason = self._unless_preparing(step, session, decision.save, decision.reason)
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
        if (
            agreed.unclean
            and deferral is None
            and (save or signum is not None)
            and (self._signals_wait or signum is None)
        ):
            self._deferral = _Deferral(step, reason if save else None)
            save, signum = False, None
        checkpoint_s = 0.0
        if save:
            started = self._clock()
            self._checkpoint(Due(step, reason))
            checkpoint_s = self._clock() - started  # counted as the checkpoint's stall
        elif session is not None and decision is not None and decision.interval is not None:
            if decision.interval.steps != self._logged_interval:
                self._send_metrics()
        if session is not None and decision is not None:
            # the recording itself is part of the hooks' cost: it is counted with the next step
            recording = self._clock()
            spent = recording - entry - checkpoint_s - settle_s + self._recording_s
            if self._device_busy is not None and self._device_busy():
                spent = 0.0  # the device still ran queued steps: the host's work here cost it nothing
            session.hook_time(spent)
            self._recording_s = self._clock() - recording
        if signum is not None:
            self._act_on_signal(step, signum, saved=save)

    def add_blocked(self, seconds: float) -> None:
        """This process waited ``seconds`` for a checkpoint outside the driver (an overlapping
        copy before the optimizer update): not counted in its step time."""
        self._step_clock.add_blocked(seconds)

    # -- end ----------------------------------------------------------------------------------

    def final(self, step: int, *, unclean: bool = False) -> None:
        """Collective, at the end of training: the final checkpoint (``save_on_train_end``), or a
        deferred one still due; none when the newest checkpoint holds ``step``, nothing was
        trained, or process 0's last loss is not finite (a warning names the checkpoint kept)."""
        deferral, self._deferral = self._deferral, None
        self._waiting = None  # the final checkpoint follows
        deferred = deferral.reason if deferral is not None else None
        reason = deferred if deferred is not None and not self.save_on_train_end else FINAL_REASON
        take = (self.save_on_train_end or deferred is not None) and self.trained and step != self.saved_step
        loss = float(self.last_loss) if take and self.last_loss is not None else None
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
        if signum is not None and self.config.on_preempt == "exit":
            raise Preempted(signum, step)

    def abandon(self) -> None:
        """``fit()`` raised: the in-flight persist completes and the session is released; an
        error is logged, never raised (the exception that stopped training stays). Any thread;
        idempotent; nothing after :meth:`finish`."""
        with self._finish_lock:
            if self._finished:
                return
            self._finished = True
        error = self._close(failed=True)
        if error is not None:
            log.error("%s", unfinished_message(error, self.config.dirpath))

    # -- internals ----------------------------------------------------------------------------

    def _unless_preparing(self, step: int, session: CheckpointSession, save: bool, reason: str) -> tuple[bool, str]:
        """Process 0, after the decision: a due checkpoint waits while a one-time preparation
        runs (at most ``PREPARATION_WAIT_S``); one put off is taken once it finished."""
        waiting = self._waiting
        if (waiting is None and not save) or self.config.every_n_steps is not None:
            return save, reason  # every_n_steps: the user asked for these exact steps
        if not (session.preparing() or (self._preparing is not None and self._preparing())):
            self._waiting = None
            return True, waiting.reason_at(step) if waiting is not None else reason
        now = self._clock()
        if waiting is None:
            waiting = _Waiting(step, reason, now)
        if now - waiting.since < PREPARATION_WAIT_S:
            self._waiting = waiting
            return False, reason
        self._waiting = None
        return True, waiting.reason_at(step)

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
                self.summary = self.session.finish()  # waits for the last persist
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
                self.session, step, signum, on_preempt=self.config.on_preempt, verbose=self.config.verbose
            )
        except Exception as exc:  # not committed: every process stops with it
            error = exc
        self.group.raise_if_any_failed(error)
        if self.config.on_preempt == "exit":
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

    def _signum(self) -> int | None:
        return self.preemption.signum if self.preemption is not None else None


class FitRecords:
    """What the current (or last) ``fit()``'s driver recorded, as a callback's attributes (a
    base of both callbacks, which keep their driver in ``_driver``; empty before a fit)."""

    _driver: FitDriver | None = None

    @property
    def events(self) -> list[CheckpointEvent]:
        """The checkpoints taken, as :class:`CheckpointEvent` records (process 0)."""
        return self._driver.events if self._driver is not None else []

    @property
    def resumed_from(self) -> int | None:
        """The step a resume restored, or None."""
        return self._driver.resumed_from if self._driver is not None else None

    @property
    def preempted(self) -> PreemptionRecord | None:
        """A :class:`PreemptionRecord` after a signal, else None."""
        return self._driver.preempted if self._driver is not None else None

    @property
    def summary(self) -> RunSummary | None:
        """The :class:`RunSummary` once the session finished (process 0), else None."""
        return self._driver.summary if self._driver is not None else None
