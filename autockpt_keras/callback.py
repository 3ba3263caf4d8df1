"""``AutoCheckpoint``: the Keras callback that maps ``fit()``'s hooks to a core :class:`FitDriver`.

The checkpoint protocol (decide, agree over processes, defer, act on a signal, the final
checkpoint, finish) is the driver's (``autockpt_core/fit_driver.py``); this module supplies
Keras' state: the copy of every variable, the resume point of the data stream and generators
(:class:`~autockpt_keras.exact_resume.ExactResume`), the epoch logs. Call order inside
``fit()`` (training thread; TensorFlow, torch and JAX backends, Keras 3)::

    on_train_begin        look up fit()'s data iterator, check the private names (internals.py),
                          the strategy or JAX processes (strategies.py); session (process 0),
                          driver; check the inputs (input_checks.py); driver.resume_record (the
                          file read while verified, whole_read.py), then assign the checkpoint's
                          state, set model._initial_epoch; install the handlers; read the step
                          (step_count.py); driver.begin
    on_epoch_begin        the resumed epoch gets its data order and generators back and skips
                          the batches already trained; read the step; driver.expect_end (the
                          epochs left × batches per epoch); driver.boundary (a checkpoint that fell
                          due at the last batch, a signal during validation or epoch-end callbacks)
    on_train_batch_begin  mark the batch as skipped or trained
    on_train_batch_end    skipped batches: nothing (the last puts the generators back); else
                          count the step (no device read) and driver.step_end (the logs,
                          unread; whether it is the epoch's last batch, asked at a decision);
                          a checkpoint copies every variable into the session's buffers
    on_test_batch_begin   in fit()'s validation: driver.outside_step, a signal acted on now
                          (validation_watch.py: the resume point kept at on_test_begin)
    on_epoch_end          with log_metrics=True: add autockpt_checkpoints, _interval_steps,
                          _stall_ms, _overhead_pct, _overhead_band_pct, _hook_pct to the
                          epoch logs (epoch_logs.py)
    on_train_end          driver.final, driver.finish, uninstall the handlers, driver.end
    (a hook raising)      release handlers, data stream and session: driver.abandon

Keras has no hook for a ``fit()`` that raises elsewhere: a :class:`~autockpt_keras.fit_watch.FitWatch`
releases the session once ``fit()`` left the stack, and the next ``on_train_begin`` does at the latest.
Put ``AutoCheckpoint`` first in ``callbacks``: generator draws of callbacks before it are not
lined up between the interrupted and the resumed run.

Several JAX processes (``jax.distributed``): process 0 alone decides and writes; every process
runs the same hooks and collectives (:mod:`autockpt_keras.processes`), reads the checkpoint
itself and sends its resume point to process 0 at each checkpoint.

Threading: the callback is not ``async_safe``, so Keras calls ``on_train_batch_end`` between
steps and the copy is consistent; only the persist runs in the background, reading the buffers.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable

import keras
import numpy as np

from autockpt_core import (
    CheckpointRecord,
    CheckpointSession,
    ResumeNotExactWarning,
)
from autockpt_core.callback_settings import CallbackSettings
from autockpt_core.checkpoint_event import CheckpointEvent
from autockpt_core.fit_driver import Due, FitDriver, FitRecords
from autockpt_core.internals_door import Patch, PatchStack
from autockpt_core.persist import storage_for
from autockpt_core.persist.shared_memory import numpy_shared_pool
from autockpt_core.persist.tensorfile import WRITE_TENSORS
from autockpt_core.persist.whole_read import ReadWhileVerifying

from . import fork_fix, internals
from .checkpoint_file import FRAMEWORK, SUFFIX, CheckpointInfo
from .copying import Copier, buffer_pool_for, copier_for, copier_preparing, device_busy_for, host_clock_note, warm_copier
from .epoch_logs import LOG_KEYS, log_values, loss_in_logs
from .exact_resume import ExactResume
from .fit_guard import FitGuard, ends_fit_on_error, set_by_fit
from .input_checks import InputReport, inspect_inputs
from .jax_state import global_step
from .processes import Processes, processes_for
from .restore import nothing_left, read_checkpoint, restore_checkpoint
from .resume_point import ResumePoint
from .skipping import unwrap_train_function
from .snapshot import StateSnapshot, buffer_layout, manifest_meta
from .state import collect_state
from .step_count import StepCount, epoch_length, is_last_batch, planned_end_step
from .strategies import check_strategy
from .validation_watch import ValidationWatch

log = logging.getLogger("autockpt")


class AutoCheckpoint(CallbackSettings, FitRecords, keras.callbacks.Callback):
    """Automatic, crash-safe checkpointing for ``model.fit()``; see the module docstring.

    Usage::

        model.fit(x, y, epochs=10, callbacks=[AutoCheckpoint("ckpts", overhead_budget="2%")])
        # rerun the same script: it resumes from the newest valid checkpoint in "ckpts"

    The keywords are :class:`~autockpt_core.callback_settings.CallbackSettings`' (the fields of
    :class:`autockpt_core.Config`, plus ``config``, ``save_on_train_end`` and ``storage``);
    :meth:`from_config` reads a YAML or TOML file. In Keras ``snapshot_mode`` is always "sync"
    ("overlap"/"device" log a warning), ``persist_mode="auto"`` keeps the writer thread on the
    torch backend with CUDA, and ``allow_pickle`` has no effect (the files hold no pickles).

    Resume: the global step is ``model.optimizer.iterations``, read at the start of ``fit()``
    and of each epoch and counted per trained batch in between (step_count.py). A rerun continues at the batch
    after the checkpoint's, with the checkpoint's variables and generators, drawing (without
    training on) the batches of the resumed epoch already trained; with reproducible (seeded)
    inputs the final weights are bitwise those of an uninterrupted run. What is not
    reproducible is named in a :class:`~autockpt_core.ResumeNotExactWarning` at the start of
    ``fit()`` (docs/reliability.md).

    Attributes (after ``fit()``; ``session``, ``events`` and ``summary`` on process 0 only):
    ``session``, ``events`` (a :class:`CheckpointEvent` per checkpoint), ``restored`` (the
    :class:`~autockpt_keras.checkpoint_file.CheckpointInfo` resumed from, or None), ``summary``
    (the :class:`~autockpt_core.RunSummary`), ``inputs`` (the
    :class:`~autockpt_keras.input_checks.InputReport` of the training data), ``preempted`` (a
    :class:`~autockpt_core.PreemptionRecord` after a signal, else None).
    """

    def _init_adapter(self) -> None:
        """The callback's own state (after :class:`CallbackSettings` set ``config``)."""
        self.session: CheckpointSession | None = None
        self.inputs: InputReport | None = None
        self._driver: FitDriver | None = None  # per fit()
        self._copier: Copier | None = None
        self._backend = ""
        self._patches = PatchStack()  # what fit() runs with swapped (internals.py): the start epoch, ...
        self._start_epoch: Patch | None = None
        self._guard = FitGuard()  # per fit(): its handlers, and a watch for a fit() that raised
        self._processes: Processes = Processes()  # replaced per fit() (jax.distributed: several)
        self._step_end: Callable[..., None] = self._before_fit  # the driver's, from on_train_begin
        self._prepare = self._prepare_buffers  # bound once: the per-batch hook passes them on
        self._at_last = self._at_last_batch
        self._reset_fit_state()

    def _reset_fit_state(self) -> None:
        """The position one ``fit()`` builds up, empty (``__init__``, and ``on_train_begin``)."""
        self.restored: CheckpointInfo | None = None
        self._epoch = 0
        self._batch: int | None = None  # the last trained batch of this epoch
        self._epoch_start: tuple[int, int | None] | None = None  # at an epoch's start: it, the last batch before
        self._completed_epoch: int | None = None
        self._stopped_mid_epoch = False
        self._buffers_ready = False
        self._exact: ExactResume | None = None  # created in on_train_begin
        self._validation = ValidationWatch()  # a signal during fit()'s validation
        self._steps = StepCount(self._read_iterations)

    # -- fit() hooks (training thread) --------------------------------------------------------

    @ends_fit_on_error
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._end_failed_fit()  # what an earlier fit() that raised left (before its first epoch, ...)
        unwrap_train_function(self.model)  # left over if an earlier fit() failed while skipping
        backend = keras.backend.backend()
        self._backend = backend
        epoch_iterator = internals.find_epoch_iterator()
        internals.check_internals(self.model, epoch_iterator, backend)  # before anything is written
        check_strategy(self.model, backend)
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
            self.session.clock_note = host_clock_note(backend)
        self._copier = copier_for(backend, self.model)
        if self.config.snapshot_mode in ("overlap", "device"):
            log.warning(
                "autockpt: snapshot_mode=%r is not available with Keras (fit() has no hook before the "
                "optimizer update); copying on the training thread (\"sync\")",
                self.config.snapshot_mode,
            )
        self._reset_fit_state()
        self.inputs = inspect_inputs(epoch_iterator, backend)
        fork_fix.install_for(backend, self.inputs.kind)
        self._exact = ExactResume(self.model, backend, epoch_iterator, self.inputs, self._patches)
        if self.inputs.problems:
            warnings.warn(
                f"autockpt: a resumed run will not be exactly an uninterrupted one ({self.inputs.kind} "
                "inputs): " + "; ".join(self.inputs.problems) + ".",
                ResumeNotExactWarning,
                stacklevel=2,
            )
        self._guard = FitGuard(self.config)
        driver = self._driver = FitDriver(
            self.config, processes, self.session, self._take, save_on_train_end=self.save_on_train_end,
            preemption=self._guard.preemption, nothing_left=lambda: nothing_left(self.restored),
            device_busy=device_busy_for(backend, self.model), preparing=lambda: copier_preparing(self._copier),
            loss_of=loss_in_logs,
        )  # fmt: skip
        self._step_end = driver.step_end
        reads = ReadWhileVerifying(self.session.storage) if self.session is not None else None
        record = driver.resume_record(
            (lambda session: session.resume_record(check=reads.check)) if reads is not None else None
        )
        if record is not None:
            self._restore(record, reads.take(record) if reads is not None else None)
        self._guard.start(self.model, driver, self.session)
        self._validation.start(self._guard.preemption, driver)
        driver.begin(self._steps.read_at(self.restored.step if self.restored is not None else None))

    @ends_fit_on_error
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._put_back_initial_epoch()
        self._epoch_start = (epoch, self._batch)
        self._epoch = epoch
        self._batch = None
        self._stopped_mid_epoch = False
        self._require_exact().epoch_begin(epoch)
        driver = self._require_driver()
        step = self._steps.epoch_begin()
        epochs = self.params.get("epochs") if self.params else None
        driver.expect_end(planned_end_step(step, epoch, epochs, self._epoch_length()))
        driver.boundary(step)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._exact is not None:
            self._exact.batch_begin(batch)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        try:  # every batch: what ends_fit_on_error does, without its extra call
            exact = self._exact if self._exact is not None else self._require_exact()
            if exact.skip_through is None:  # no resumed epoch's skip ahead: the stream counts it
                exact.stream.batch_end()
            elif exact.batch_end(batch):  # a skipped batch: it was drawn, not trained
                self._steps.skipped(batch)
                return
            self._batch = batch
            self._epoch_start = None
            # the loss in the logs (maybe a device value), the epoch's last batch (known after
            # validation) and the buffers' preparation are read only at a decision
            self._step_end(self._steps.trained(batch), logs, self._at_last, self._prepare)
            if self._validation.watching and self._at_last_batch():  # its point, for a validation next
                self._validation.last_batch(self._epoch, batch, lambda: exact.mid_epoch_point(self._epoch, batch))
        except BaseException:
            self._end_failed_fit()
            raise

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._completed_epoch = epoch
        # A callback's stop_training at a batch end cut this epoch short: its rest is untrained.
        self._stopped_mid_epoch = bool(
            self.model.stop_training and self._batch is not None and not self._at_last_batch()
        )
        if logs is not None and self.config.log_metrics:  # None: the progress bar stays as it was
            logs.update(self.log_values())

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        """fit()'s validation begins: a signal during it is acted on at its next batch."""
        point = lambda: self._require_exact().mid_epoch_point(self._epoch, self._batch)  # type: ignore[arg-type]
        self._validation.begin(self._epoch, self._batch, point)

    @ends_fit_on_error
    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._validation.batch_begin(self._steps.step)

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._validation.end()

    @ends_fit_on_error
    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._guard.stop_watch()  # fit() ends through this hook: the session is finished here
        self._put_back_initial_epoch()
        self._require_exact().close()
        driver = self._require_driver()
        try:
            if self._batch is not None:  # the last epoch trained: the final checkpoint is of its position
                driver.final(self._steps.step)
            driver.finish()
        finally:
            self._guard.stop_signals()
        driver.end(self._steps.step)
        self._require_exact().release()

    # -- what the driver calls (training thread) ----------------------------------------------

    def _take(self, due: Due) -> CheckpointEvent | None:
        """Every process: the checkpoint of ``due.step`` at the resume point of this boundary.
        Process 0 copies the state and hands the file to the writer, with every process's point."""
        point, epoch, batch = self._position(due.final)
        processes = self._processes
        points = processes.gather_text(point.to_json()) if processes.count > 1 else None
        if self.session is None:
            return None
        session = self.session
        snapshot = StateSnapshot(
            self.model, self._require_copier(), self._backend, point,
            step=due.step, epoch=epoch, batch=batch, process_points=points,
        )  # fmt: skip
        steps_per_epoch = self.params.get("steps") if self.params else None
        meta = manifest_meta(self._backend, point, batch=batch, steps_per_epoch=steps_per_epoch)
        stall = session.save(due.step, epoch, snapshot, meta=meta, reason=due.reason)
        return CheckpointEvent.after_save(
            session, due.step, epoch, due.reason, stall, snapshot.nbytes,
            batch=batch, next_epoch=point.epoch, batches_done=point.batches_done,
        )  # fmt: skip

    def _position(self, final: bool) -> tuple[ResumePoint, int, int | None]:
        """Where a run resumed from a checkpoint taken now continues: the point, and the epoch
        and batch of the step it holds."""
        exact = self._require_exact()
        if self._validation.point is not None and not final and self._batch is not None:
            return self._validation.point, self._epoch, self._batch  # as validation began
        if final:
            epoch, batch = self._epoch, self._batch
            assert batch is not None
            if self._completed_epoch == epoch and not self._stopped_mid_epoch:
                return exact.next_epoch_point(epoch), epoch, batch
            return exact.mid_epoch_point(epoch, batch), epoch, batch
        if self._epoch_start is not None:
            epoch, last_batch = self._epoch_start
            return exact.epoch_start_point(epoch), epoch - 1, last_batch
        assert self._batch is not None
        return exact.mid_epoch_point(self._epoch, self._batch), self._epoch, self._batch

    def _prepare_buffers(self, session: CheckpointSession) -> None:
        """The first trained batch: every variable exists now; the copier prepares its read and
        the pool allocates and faults in the buffers in its helper thread while training goes on."""
        if not self._buffers_ready:
            self._buffers_ready = True
            entries = collect_state(self.model)
            warm_copier(self._require_copier(), entries)
            session.buffers.prefault(buffer_layout(entries))

    # -- resume (training thread) -------------------------------------------------------------

    def _restore(self, record: CheckpointRecord, verified: np.ndarray | None) -> None:
        """on_train_begin, every process: the checkpoint's state, and where its epoch resumes.
        ``verified``: the file's bytes, where they were read while verifying it (process 0)."""
        if self.session is not None:
            storage = self.session.storage
        else:
            storage = self._storage or storage_for(self.config.dirpath, self.config.storage_options)
        arrays, info = read_checkpoint(storage, record, self._processes, verified)
        say = self.config.verbose and self._processes.writes
        restore_checkpoint(self.model, self._require_exact(), arrays, info, say=say)
        self.restored = info
        self._require_driver().resumed(info.step)
        self._start_epoch = self._patches.set(self.model, internals.initial_epoch_key(), info.next_epoch)

    def _at_last_batch(self) -> bool:
        """Whether the newest trained batch is the epoch's last (False while its length is unknown)."""
        return self._batch is not None and is_last_batch(self._batch, self._epoch_length())

    def _epoch_length(self) -> int | None:
        return epoch_length(self.params, self._exact.epoch_iterator if self._exact is not None else None)

    def _end_failed_fit(self) -> None:
        """Release what a ``fit()`` that raised (``Preempted`` included) left: the signal
        handlers, ``model._initial_epoch``, the wrapped data stream, and the session.

        Called when one of this callback's hooks raises, and by the next ``on_train_begin``
        (for a ``fit()`` that raised elsewhere: the session is released at the latest then, or
        when it is garbage-collected). Idempotent. Its in-flight persist completes; a persist
        error is logged, not raised (that fit is over, with its own exception).
        """
        self._guard.stop()
        self._put_back_initial_epoch()
        if self._exact is not None:
            self._exact.close()
            self._exact.release()
        self._patches.undo_all()
        if self._driver is not None:
            self._driver.abandon()

    # -- helpers ----------------------------------------------------------------------------

    def log_values(self) -> dict[str, float]:
        """The ``autockpt_*`` numbers for the logs (NaN where not measured yet)."""
        return log_values(self.session.metrics() if self.session is not None else {})

    def _read_iterations(self) -> int:
        """``optimizer.iterations`` (waits for the device). On JAX, Callback.model reattaches
        fit()'s whole state at every access: read it raw."""
        return global_step(self._model if self._backend == "jax" else self.model, self._backend)

    def _put_back_initial_epoch(self) -> None:
        self._patches.undo(self._start_epoch)

    def _require_copier(self) -> Copier:
        return set_by_fit(self._copier)

    def _require_exact(self) -> ExactResume:
        return set_by_fit(self._exact)

    def _before_fit(self, *args: Any, **kwargs: Any) -> None:
        self._require_driver()

    def _require_driver(self) -> FitDriver:
        return set_by_fit(self._driver)
