"""``AutoCheckpoint``: the Keras callback that drives a :class:`~autockpt_core.CheckpointSession`.

The callback holds no policy: it maps ``fit()``'s hooks to session calls, copies the state,
and, through an :class:`~autockpt_keras.exact_resume.ExactResume` it creates per ``fit()``,
puts a resumed run back at the exact batch and generator state the checkpoint was taken at
(that module's docstring details those steps). Order of calls inside ``fit()`` (TensorFlow
and torch trainers, Keras 3):

1. ``on_train_begin``: the ``tf.distribute`` strategy or the JAX processes are checked
   (:mod:`autockpt_keras.strategies`); a new session (process 0 only, with several JAX
   processes: see below); ``fit()``'s data iterator is looked up and its input
   type checked (a :class:`~autockpt_core.ResumeNotExactWarning` names what would keep a
   resume from being exact, :mod:`autockpt_keras.input_checks`); ``session.resume_record()``;
   if a valid checkpoint exists, the model's and optimizer's variables are built if needed
   and assigned, and ``model._initial_epoch`` is set (``fit()`` reads it right after this
   hook); the preemption signal handlers are installed; ``session.start(optimizer.iterations)``.
2. ``on_epoch_begin``: the resumed epoch gets the checkpoint's data order and generators and
   skips the batches already trained; another epoch captures the generators when a new data
   iterator is about to start. A checkpoint that fell due at the previous epoch's last batch
   is taken here (after validation and the epoch-end callbacks, whose generator draws the
   resumed run then need not repeat).
3. ``on_train_batch_begin``: marks the call as skipped or not.
4. ``on_train_batch_end``: skipped batches do nothing, except the last one, which sets the
   generators to their state at the checkpoint. Otherwise ``session.step_end(
   optimizer.iterations, loss)``; when the decision says so, ``session.save(...)`` copies
   every variable into the session's reusable buffers and captures the generators (the
   only time the training loop is blocked) and hands the file to the writer thread. The
   first call also does one untimed copy, during the profiler's warm-up, that allocates
   those buffers (and traces TensorFlow's batched read). After a preemption signal: a
   checkpoint of this step, committed (durable) before the hook returns, then
   :class:`~autockpt_core.Preempted` (``on_preempt="exit"``) or training goes on.
5. ``on_epoch_end``: adds ``autockpt_checkpoints``, ``autockpt_interval_steps``,
   ``autockpt_stall_ms`` and ``autockpt_overhead_pct`` to the epoch logs. ``fit()`` passes
   the same dict to every callback and appends its own ``History`` last, so the keys land in
   ``history.history`` (NaN until the value is known, so every list has one entry per epoch).
   A ``History`` passed explicitly must come after ``AutoCheckpoint`` in ``callbacks``.
6. ``on_train_end``: a checkpoint still due, or a final one if training advanced since the
   newest one (``save_on_train_end``), then ``session.finish()`` (waits for the last persist)
   and the summary line when ``verbose``; the signal handlers are uninstalled.

Put ``AutoCheckpoint`` first in ``callbacks``: generator draws of callbacks before it are
not lined up between the interrupted and the resumed run.

Several JAX processes (``jax.distributed``, a ``DataParallel`` over all their devices): only
process 0 creates a session, decides and writes. Every process runs the same hooks and calls
the same collectives (:mod:`autockpt_keras.processes`): process 0's resume record goes to the
others in ``on_train_begin`` (each reads the file itself); at each batch end one agreement
carries process 0's decision, any process's signal and failure and the slowest step; at a
checkpoint every process's resume point is gathered into the file; ``on_epoch_begin`` and
``on_train_end`` agree on signals and failures once more. An error on one process is raised
on every process, so none waits in a collective for one that stopped.

Threading: every hook runs on the training thread; the callback is not ``async_safe``, so
Keras calls ``on_train_batch_end`` synchronously between steps and the copy is consistent.
Only the file write, fsync, manifest update and retention run in the session's writer
thread, reading the buffers, never the live variables. A failed write is raised as
:class:`~autockpt_core.CheckpointWriteError` from a later hook (so ``fit()`` stops), and the
previous checkpoint stays the newest valid one. Signal handlers only set a flag (see
:mod:`autockpt_core.preemption`); the checkpoint is taken by the next hook.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import signal
import threading
import time
import warnings
from types import FrameType
from typing import Any, Callable, TypeVar, cast

import keras

from autockpt_core import (
    AutockptError,
    CheckpointRecord,
    CheckpointSession,
    Preempted,
    PreemptionHandler,
    PreemptionRecord,
    ResumeNotExactWarning,
    RunSummary,
)
from autockpt_core.callback_settings import CallbackSettings
from autockpt_core.checkpoint_event import CheckpointEvent
from autockpt_core.emergency import commit_emergency
from autockpt_core.persist import storage_for
from autockpt_core.persist.failures import unfinished_message
from autockpt_core.persist.shared_memory import numpy_shared_pool
from autockpt_core.persist.tensorfile import WRITE_TENSORS
from autockpt_core.policy.rank_timing import StepClock

from .checkpoint_file import FRAMEWORK, SUFFIX, CheckpointInfo, read_record
from .copying import Copier, buffer_pool_for, copier_for
from .data_stream import find_epoch_iterator
from .exact_resume import ExactResume
from .fit_frame import find_fit_frame, is_on_stack
from .fit_watch import FitWatch
from .input_checks import InputReport, inspect_inputs
from .jax_state import optimizer_step
from .processes import Processes, processes_for
from .resume_point import ResumePoint
from .skipping import unwrap_train_function
from .snapshot import StateSnapshot, manifest_meta, prepare_buffers
from .state import REPLICA, assign_state, collect_state, ensure_built
from .strategies import check_strategy

log = logging.getLogger("autockpt")

#: Keys added to the epoch logs (and so to ``History``), from ``session.metrics()``.
LOG_KEYS = {
    "autockpt_checkpoints": "autockpt/checkpoints",
    "autockpt_interval_steps": "autockpt/interval_steps",
    "autockpt_stall_ms": "autockpt/stall_ms",
    "autockpt_overhead_pct": "autockpt/overhead_pct",
}


_Hook = TypeVar("_Hook", bound=Callable[..., None])


def _ends_fit_on_error(hook: _Hook) -> _Hook:
    """A hook that raises ends this ``fit()`` for autockpt before the exception leaves it.

    Keras has no hook for a ``fit()`` that raises, so the signal handlers and the session
    (with its directory lock) are released here: ``fit()`` is about to raise this exception.
    """

    @functools.wraps(hook)
    def wrapper(self: "AutoCheckpoint", *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except BaseException:
            self._end_failed_fit()
            raise

    return cast(_Hook, wrapper)


class AutoCheckpoint(CallbackSettings, keras.callbacks.Callback):
    """Automatic, crash-safe checkpointing for ``model.fit()``; see the module docstring.

    Usage::

        model.fit(x, y, epochs=10, callbacks=[AutoCheckpoint("ckpts", overhead_budget="2%")])
        # rerun the same script: it resumes from the newest valid checkpoint in "ckpts"

    The keywords are :class:`~autockpt_core.callback_settings.CallbackSettings`' (the fields
    of :class:`autockpt_core.Config`, documented there, plus ``config``, ``save_on_train_end``
    and ``storage``); a bad value raises :class:`~autockpt_core.ConfigError` at construction;
    :meth:`from_config` reads a YAML or TOML file. In Keras: ``snapshot_mode`` is always
    "sync" (the copy runs on the training thread before the hook returns; on the torch backend
    with CUDA through a copy stream into pinned buffers; "overlap"/"device" log a warning);
    ``persist_mode="auto"`` keeps the writer thread on the torch backend with CUDA;
    ``allow_pickle`` has no effect (Keras checkpoints hold no pickles). ``signals`` are
    installed in ``on_train_begin`` (main thread only) and uninstalled in ``on_train_end``.

    Resume: the global step is ``model.optimizer.iterations``. A rerun continues at the
    batch after the checkpoint's: the weights, optimizer, metric and seed-generator state are
    the checkpoint's, the global generators (Python, numpy, torch, Keras' and TensorFlow's
    global generators) are put back, and the resumed epoch draws (without training on) the
    batches the interrupted run had already trained, so the rest of the run sees the data an
    uninterrupted run would. On the TensorFlow, torch and JAX backends with array, ``PyDataset``,
    tf.data or torch ``DataLoader`` inputs whose order is reproducible (seeded), the final
    weights are bitwise those of an uninterrupted run without this callback. What is not
    reproducible is named in a :class:`~autockpt_core.ResumeNotExactWarning` at the start of
    ``fit()``; see ``docs/reliability.md``. A checkpoint that falls due at an epoch's last
    batch is taken at the next epoch's start (or at the end of training).

    Attributes (after ``fit()``; ``session``, ``events`` and ``summary`` on process 0 only when
    several JAX processes train): ``session`` (the :class:`~autockpt_core.CheckpointSession`),
    ``events`` (a :class:`CheckpointEvent` per checkpoint), ``restored`` (the
    :class:`~autockpt_keras.checkpoint_file.CheckpointInfo` resumed from, or None),
    ``summary`` (the :class:`~autockpt_core.RunSummary`), ``inputs`` (the
    :class:`~autockpt_keras.input_checks.InputReport` of the training data), ``preempted`` (a
    :class:`~autockpt_core.PreemptionRecord` after a signal, else None).
    """

    def _init_adapter(self) -> None:
        """The callback's own state (after :class:`CallbackSettings` set ``config``)."""
        self.session: CheckpointSession | None = None
        self.inputs: InputReport | None = None
        self._copier: Copier | None = None
        self._backend = ""
        self._initial_epoch_to_put_back: tuple[Any] | None = None
        self._preemption: PreemptionHandler | None = None
        self._fit_frame: FrameType | None = None  # the running fit()'s frame, while it runs
        self._watch: FitWatch | None = None  # releases the session of a fit() that raised elsewhere
        self._release_lock = threading.Lock()
        self._session_open = False  # session created by on_train_begin and not finished yet
        self._processes: Processes = Processes()  # replaced per fit() (jax.distributed: several)
        self._step_clock = StepClock()  # this process's step times, combined in the agreement
        self._reset_fit_state()

    def _reset_fit_state(self) -> None:
        """The state one ``fit()`` builds up, empty (``__init__``, and ``on_train_begin``).

        Not here: what ``on_train_begin`` replaces anyway (``session``, ``inputs``, the copier
        and the backend), the initial epoch to put back (put back first) and the signal
        handler (replaced when ``signals`` are configured).
        """
        self.events: list[CheckpointEvent] = []
        self.restored: CheckpointInfo | None = None
        self.summary: RunSummary | None = None
        self.preempted: PreemptionRecord | None = None
        self._epoch = 0
        self._batch: int | None = None
        self._completed_epoch: int | None = None
        self._stopped_mid_epoch = False
        self._last_saved_step: int | None = None
        self._last_loss: float | None = None
        self._buffers_ready = False
        self._deferred: tuple[int, str, int] | None = None  # (step, reason, batch) due at an epoch's last batch
        self._exact: ExactResume | None = None  # created in on_train_begin

    # -- fit() hooks (training thread) --------------------------------------------------------

    @_ends_fit_on_error
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._end_failed_fit()  # what an earlier fit() that raised left (before its first epoch, ...)
        unwrap_train_function(self.model)  # left over if an earlier fit() failed while skipping
        backend = keras.backend.backend()
        self._backend = backend
        check_strategy(self.model, backend)  # before anything is written
        self._processes = processes = processes_for(backend)
        self.session = None
        if processes.writes:  # process 0 alone decides and writes; the others follow it
            pinned = buffer_pool_for(backend)  # pinned buffers (torch backend with CUDA) cannot be shared
            self.session = CheckpointSession(
                self.config,
                framework=FRAMEWORK,
                suffix=SUFFIX,
                storage=self._storage,
                buffers=pinned,
                shared_buffers=numpy_shared_pool if pinned is None else None,
                persist_modules=(WRITE_TENSORS.partition(":")[0],),
                gpu=pinned is not None,
            )
            self._session_open = True
        self._copier = copier_for(backend, self.model)
        if self.config.snapshot_mode in ("overlap", "device"):
            log.warning(
                "autockpt: snapshot_mode=%r is not available with Keras (fit() has no hook before the "
                "optimizer update); copying on the training thread (\"sync\")",
                self.config.snapshot_mode,
            )
        self._reset_fit_state()
        epoch_iterator = find_epoch_iterator()
        self.inputs = inspect_inputs(epoch_iterator, backend)
        self._exact = ExactResume(self.model, backend, epoch_iterator, self.inputs)
        if self.inputs.problems:
            warnings.warn(
                f"autockpt: a resumed run will not be exactly an uninterrupted one ({self.inputs.kind} "
                "inputs): " + "; ".join(self.inputs.problems) + ".",
                ResumeNotExactWarning,
                stacklevel=2,
            )
        record = self._resume_record()
        if record is not None:
            self._restore(record)
        # Keras has no hook for a fit() that raises: the signal handler checks that fit() still
        # runs, and a watch releases the session once fit() is gone without on_train_end.
        self._fit_frame = find_fit_frame(self.model)
        if self._fit_frame is not None and self.session is not None:
            self._watch = FitWatch(self._fit_frame, threading.get_ident(), self._release_after_failed_fit)
            self._watch.start()
        if self.config.signals:
            self._preemption = PreemptionHandler(self.config.signals, alive=self._fit_is_running)
            self._preemption.install()
        if self.session is not None:
            self.session.start(self._global_step())
        self._step_clock.start()

    @_ends_fit_on_error
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._put_back_initial_epoch()
        self._epoch = epoch
        self._batch = None
        self._stopped_mid_epoch = False
        exact = self._require_exact()
        exact.epoch_begin(epoch)
        if self._deferred is not None:
            step, reason, last_batch = self._deferred
            self._deferred = None
            if step == self._global_step() and step != self._last_saved_step:
                self._save(step, reason, exact.epoch_start_point(epoch), epoch=epoch - 1, batch=last_batch)
        signum = self._agreed_signal(None)  # a signal in validation or an epoch-end callback, on any process
        if signum is not None:
            self._on_preempted(self._global_step(), lambda: exact.epoch_start_point(epoch), epoch - 1, None, signum)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._exact is not None:
            self._exact.batch_begin(batch)

    @_ends_fit_on_error
    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        exact = self._require_exact()
        if exact.batch_end(batch):  # a skipped batch: it was drawn, not trained
            return
        self._batch = batch
        loss = (logs or {}).get("loss")
        if loss is not None:
            self._last_loss = float(loss)
        step = self._global_step()
        save, reason, signum = self._step_decision(step, loss)
        saved = False
        if save:
            if self._is_last_batch(batch) and signum is None:
                self._deferred = (step, reason, batch)  # taken in on_epoch_begin / on_train_end
            else:
                point = exact.mid_epoch_point(self._epoch, batch)
                self._save(step, reason, point, epoch=self._epoch, batch=batch)
                saved = True
        if signum is not None:
            self._deferred = None
            point_now = lambda: exact.mid_epoch_point(self._epoch, batch)  # noqa: E731
            self._on_preempted(step, point_now, self._epoch, batch, signum, saved=saved)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._completed_epoch = epoch
        # A callback's stop_training at a batch end cut this epoch short: its rest is untrained.
        self._stopped_mid_epoch = bool(
            self.model.stop_training and self._batch is not None and not self._is_last_batch(self._batch)
        )
        if logs is not None:
            logs.update(self.log_values())

    @_ends_fit_on_error
    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._stop_watch()  # fit() ends through this hook: the session is finished here
        self._put_back_initial_epoch()
        self._require_exact().close()
        processes = self._processes
        try:
            step = self._global_step()
            due = self._deferred is not None and self._deferred[0] == step
            reason = self._deferred[1] if self._deferred is not None else "end of training"
            self._deferred = None
            if step != self._last_saved_step and self._batch is not None and (due or self.save_on_train_end):
                if self._last_loss is not None and not math.isfinite(self._last_loss):
                    if processes.writes:
                        warnings.warn(
                            f"autockpt: no final checkpoint: the last loss is {self._last_loss}; the newest "
                            f"checkpoint stays step {self._last_saved_step}",
                            RuntimeWarning,
                            stacklevel=2,
                        )
                else:
                    self._save_at_train_end(step, reason)
            error: BaseException | None = None
            if self.session is not None:
                self._session_open = False
                try:
                    self.summary = self.session.finish()
                except Exception as exc:  # the last persist failed: every process stops with it
                    error = exc
            signum = self._agreed_signal(error)  # a signal after the last batch, on any process
        finally:
            self._stop_preemption()
        if processes.writes and self.summary is not None:
            restored = self.restored
            if self._batch is None and restored is not None and restored.next_epoch >= self.params.get("epochs", 0):
                message = (
                    f"autockpt: nothing left to train: the checkpoint at step {restored.step} "
                    f"already finished {restored.next_epoch} epoch(s); pass a larger epochs= to continue"
                )
                log.info(message)
            else:
                message = self.summary.line()
            if self.config.verbose:
                print(message, flush=True)
        if signum is not None and self.config.on_preempt == "exit":
            # The signal came after the last batch: training is complete and committed.
            raise Preempted(signum, self._global_step())

    # -- resume and final checkpoint (training thread) ----------------------------------------------

    def _resume_record(self) -> CheckpointRecord | None:
        """on_train_begin: the checkpoint process 0 resumes from (every process gets its record)."""
        processes = self._processes
        record, error = None, None
        if self.session is not None:
            try:
                record = self.session.resume_record()
            except Exception as exc:  # a bad manifest, an unreachable store: every process stops
                error = exc
        processes.raise_if_any_failed(error)
        if processes.count == 1:
            return record
        text = processes.gather_text(json.dumps(record.to_json()) if record is not None else "")[0]
        return CheckpointRecord.from_json(json.loads(text)) if text else None

    def _read_checkpoint(self, record: CheckpointRecord) -> tuple[dict[str, Any], CheckpointInfo]:
        """Every process reads the file process 0 chose (so ``dirpath`` must be one they all reach)."""
        processes = self._processes
        if self.session is not None:
            storage = self.session.storage
        else:
            storage = self._storage or storage_for(self.config.dirpath, self.config.storage_options)
        result, error = None, None
        try:
            result = read_record(storage, record)
        except Exception as exc:
            error = exc
            if not processes.writes:
                error = AutockptError(
                    f"process {processes.index} cannot read {record.name}, the checkpoint process 0 resumes "
                    f"from, in {storage.location} ({type(exc).__name__}: {exc}). Fix: a dirpath every process "
                    "reaches (a shared file system or an object-store URL)."
                )
        processes.raise_if_any_failed(error)
        assert result is not None
        arrays, info = result
        return arrays, info.for_process(processes.index, processes.count)

    def _restore(self, record: CheckpointRecord) -> None:
        """on_train_begin: assign the checkpoint's state; remember where its epoch resumes."""
        exact = self._require_exact()
        arrays, info = self._read_checkpoint(record)
        ensure_built(self.model)
        exact.prepare_metrics()
        report = assign_state(collect_state(self.model), arrays, order=info.keys)
        lost = [k for k in report.skipped if REPLICA in k]
        if lost:
            warnings.warn(
                f"autockpt: resuming at step {info.step} is not exact: the checkpoint holds per-device copies "
                f"of {len(lost)} non-trainable variable(s) (BatchNorm statistics, metric totals) from a "
                "tf.distribute run on other devices; here every device starts from the first device's values.",
                ResumeNotExactWarning,
                stacklevel=4,  # the caller of on_train_begin
            )
        self.restored = info
        self._last_saved_step = info.step
        self._initial_epoch_to_put_back = (self.model._initial_epoch,)
        self.model._initial_epoch = info.next_epoch  # read by fit() right after this hook
        point = exact.resume_from(info, arrays)
        del arrays
        if self.config.verbose and self._processes.writes:
            where = f"epoch {info.next_epoch + 1}"
            if point is not None and point.batches_done > 0:
                where += f", batch {point.batches_done + 1} (drawing the {point.batches_done} batch(es) already trained)"
            elif point is None and info.batch is not None and info.next_epoch == info.epoch:
                where += " from its first batch (this checkpoint has no batch position)"
            print(f"autockpt: resumed from {info.path} (step {info.step}); training continues with {where}", flush=True)

    def _save_at_train_end(self, step: int, reason: str) -> None:
        """The final checkpoint: at the next epoch's start if the last epoch ran to its end."""
        epoch, batch = self._epoch, self._batch
        assert batch is not None
        exact = self._require_exact()
        if self._completed_epoch == epoch and not self._stopped_mid_epoch:
            point = exact.next_epoch_point(epoch)
        else:
            point = exact.mid_epoch_point(epoch, batch)
        self._save(step, reason, point, epoch=epoch, batch=batch)

    def _is_last_batch(self, batch: int) -> bool:
        """Whether ``batch`` is the epoch's last (False when the epoch length is not known yet)."""
        steps = self.params.get("steps") if self.params else None
        epoch_iterator = self._exact.epoch_iterator if self._exact is not None else None
        if steps is None and epoch_iterator is not None:
            steps = getattr(epoch_iterator, "num_batches", None)  # inferred after a first epoch
        return steps is not None and batch + 1 >= steps

    # -- preemption (training thread) -----------------------------------------------------------

    def _on_preempted(
        self,
        step: int,
        point: Callable[[], ResumePoint],
        epoch: int,
        batch: int | None,
        signum: int,
        saved: bool = False,
    ) -> None:
        """A signal reached this process or another (``signum``, agreed): commit a checkpoint of
        this step (durable), then exit or continue; every process does the same."""
        if not saved and step != self._last_saved_step:
            self._save(step, f"preempted by {signal.Signals(signum).name}", point(), epoch=epoch, batch=batch)
        error = None
        try:
            self.preempted = commit_emergency(
                self.session, step, signum, on_preempt=self.config.on_preempt, verbose=self.config.verbose
            )
        except Exception as exc:  # the checkpoint was not persisted: every process stops with it
            error = exc
        self._processes.raise_if_any_failed(error)
        if self.config.on_preempt == "exit":
            # Raised from a hook: _ends_fit_on_error releases the handlers, the data stream
            # and the session (already flushed) on its way out of fit().
            raise Preempted(signum, step)
        if self._preemption is not None:
            self._preemption.clear()

    def _stop_preemption(self) -> None:
        if self._preemption is not None:
            self._preemption.uninstall()
        self._fit_frame = None

    def _fit_is_running(self, frame: FrameType | None) -> bool:
        """In the signal handler: whether the ``fit()`` this callback serves is on the stack."""
        fit_frame = self._fit_frame
        if fit_frame is None or is_on_stack(fit_frame, frame):
            return True  # its frame was not found at on_train_begin: it is taken to be running
        self._fit_frame = None
        return False

    def _end_failed_fit(self) -> None:
        """Release what a ``fit()`` that raised (``Preempted`` included) left: the signal
        handlers, ``model._initial_epoch``, the wrapped data stream, and the session.

        Called when one of this callback's hooks raises, and by the next ``on_train_begin``
        (for a ``fit()`` that raised elsewhere: the session is released at the latest then, or
        when it is garbage-collected). Idempotent. Its in-flight persist completes; a persist
        error is logged, not raised (that fit is over, with its own exception).
        """
        self._stop_watch()
        self._stop_preemption()
        self._put_back_initial_epoch()
        if self._exact is not None:
            self._exact.close()
        self._release_after_failed_fit()

    def _release_after_failed_fit(self) -> None:
        """Finish the session of a ``fit()`` that raised: its in-flight persist completes, the
        host buffers and the directory lock are released (training thread, or the fit watch's
        thread once ``fit()`` left the stack without ``on_train_end``). Idempotent."""
        with self._release_lock:
            if self.session is None or not self._session_open:
                return
            self._session_open = False
            try:
                self.session.finish()
            except Exception as exc:
                log.error("%s", unfinished_message(exc, self.config.dirpath))

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None

    # -- helpers ----------------------------------------------------------------------------

    def log_values(self) -> dict[str, float]:
        """The ``autockpt_*`` numbers for the logs (NaN where not measured yet)."""
        metrics = self.session.metrics() if self.session is not None else {}
        return {name: float(metrics.get(source, math.nan)) for name, source in LOG_KEYS.items()}

    def _step_decision(self, step: int, loss: Any) -> tuple[bool, str, int | None]:
        """At a batch end: whether to checkpoint now (process 0's decision), why, and a signal
        any process received (None: none). With several processes, one agreement."""
        processes = self._processes
        times = self._step_clock.lap()
        own = self._preemption.signum if self._preemption is not None else None
        session = self.session
        save, reason, error = False, "", None
        if session is not None:
            try:
                if not self._buffers_ready:  # the train step has run once: every variable exists now
                    self._buffers_ready = True
                    prepare_buffers(session.buffers, self._require_copier(), self.model)
                decision = session.step_end(step, loss=loss)
                save, reason = decision.save, decision.reason
            except Exception as exc:  # a persist error, a failed allocation: every process stops
                error = exc
        agreed = processes.settle(error, save=save, signum=own, times=times)
        if session is not None and processes.count > 1:
            session.combine_ranks(agreed.slowest)  # the interval suits the slowest process
        return agreed.save, reason, agreed.signum

    def _agreed_signal(self, error: BaseException | None) -> int | None:
        """Outside a batch end: a signal any process received (None: none); ``error``: this
        process's failure, raised on every process."""
        own = self._preemption.signum if self._preemption is not None else None
        return self._processes.settle(error, signum=own).signum

    def _save(self, step: int, reason: str, point: ResumePoint, *, epoch: int, batch: int | None) -> None:
        """Every process: the checkpoint of ``step`` at ``point`` (captured now). Process 0
        copies the state and hands the file to the writer, with every process's generators."""
        processes = self._processes
        start = time.perf_counter()
        points = processes.gather_text(point.to_json()) if processes.count > 1 else None
        error = None
        if self.session is not None:
            try:
                self.events.append(self._snapshot(step, reason, point, points, epoch=epoch, batch=batch))
            except Exception as exc:  # a failed copy, the previous persist's error: every process stops
                error = exc
        processes.raise_if_any_failed(error)
        self._last_saved_step = step
        self._step_clock.add_blocked(time.perf_counter() - start)

    def _snapshot(
        self, step: int, reason: str, point: ResumePoint, points: list[str] | None, *, epoch: int, batch: int | None
    ) -> CheckpointEvent:
        """Process 0: snapshot the state and hand the file to the writer."""
        session = self._require_session()
        snapshot = StateSnapshot(
            self.model,
            self._require_copier(),
            self._backend,
            point,
            step=step,
            epoch=epoch,
            batch=batch,
            process_points=points,
        )
        steps_per_epoch = self.params.get("steps") if self.params else None
        meta = manifest_meta(self._backend, point, batch=batch, steps_per_epoch=steps_per_epoch)
        stall = session.save(step, epoch, snapshot, meta=meta, reason=reason)
        return CheckpointEvent.after_save(
            session, step, epoch, reason, stall, snapshot.nbytes,
            batch=batch, next_epoch=point.epoch, batches_done=point.batches_done,
        )  # fmt: skip

    def _global_step(self) -> int:
        # On JAX, Callback.model reattaches fit()'s whole state at every access: read it raw
        model = self._model if self._backend == "jax" else self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise RuntimeError("AutoCheckpoint needs a compiled model (model.compile(optimizer=...)).")
        if self._backend == "jax":
            return optimizer_step(model)
        return int(optimizer.iterations.numpy())

    def _put_back_initial_epoch(self) -> None:
        if self._initial_epoch_to_put_back is not None:
            (self.model._initial_epoch,) = self._initial_epoch_to_put_back
            self._initial_epoch_to_put_back = None

    def _require_copier(self) -> Copier:
        if self._copier is None:
            raise RuntimeError("AutoCheckpoint hooks ran before on_train_begin; use it through model.fit().")
        return self._copier

    def _require_session(self) -> CheckpointSession:
        if self.session is None:
            raise RuntimeError("AutoCheckpoint hooks ran before on_train_begin; use it through model.fit().")
        return self.session

    def _require_exact(self) -> ExactResume:
        if self._exact is None:
            raise RuntimeError("AutoCheckpoint hooks ran before on_train_begin; use it through model.fit().")
        return self._exact
