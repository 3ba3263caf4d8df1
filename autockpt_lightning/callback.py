"""``AutoCheckpoint``: the Lightning callback that maps ``fit()``'s hooks to a core :class:`FitDriver`.

The checkpoint protocol (decide, agree over ranks, defer, act on a signal, the final checkpoint,
finish) is the driver's (``autockpt_core/fit_driver.py``); this module supplies Lightning's
state: the snapshot of ``dump_checkpoint()``, which boundaries resume exactly, the RNG and
sampler entry, the loggers. Call order (training thread, every rank)::

    __init__                  build and validate the Config (ConfigError names the field)
    setup("fit")              refuse unsupported strategies (distributed.py, sharded.py)
    on_fit_start              session (global rank 0) and driver; signal handlers, SIGTERM taken
                              from Lightning (signals.py); auto-resume without ckpt_path
                              (auto_resume.load_newest: every rank, errors raised on all)
    load_state_dict           (inside the restore) keep this callback's entry until training starts
    on_train_start            apply the entry (samplers, then RNG); driver.begin; driver.expect_end
                              (planned_end.py); driver.boundary (a signal during the resume);
                              watch each validation's start (validation_watch.py)
    on_validation_batch_start driver.outside_step: a signal in validation or the sanity check
    on_before_optimizer_step  wait for an overlapping copy (snapshot_mode "overlap"/"device")
    on_train_batch_end        once per optimizer step: driver.step_end (the loss, whether this
                              boundary resumes exactly, buffer warm-up); a checkpoint runs
                              dump_checkpoint() and copies the tensors into the session's buffers
    state_dict                (inside dump_checkpoint) every rank's RNG, sampler positions
    on_train_end              driver.final (meta: whether a run continues exactly), driver.finish
    on_fit_end                uninstall the handlers; driver.finish (nothing was trained), end
    on_exception              uninstall the handlers; driver.abandon (errors logged, not raised)

Exact resume (docs/reliability.md): with the same seed and deterministic settings, a killed and
rerun fit ends with the same weights, bit for bit, as one that never stopped, when the train
loader is stateful (torchdata ``StatefulDataLoader``) or a ``DataLoader`` with a
:class:`~autockpt_torch.ResumableSampler`; what cannot be exact is named in a
``ResumeNotExactWarning`` at train start. A checkpoint due at an epoch's last batch or right
before validation is taken one step later (Lightning cannot resume exactly from there), and a
signal there waits for that step too.

Distributed (docs/distributed.md): global rank 0 owns the session; all ranks call
``dump_checkpoint`` together; one all-reduce per step carries rank 0's decision, any rank's
signal and failure (:class:`~autockpt_lightning.distributed.LightningRanks`). Sharded models
(``ModelParallelStrategy``) are written by every rank through ``torch.distributed.checkpoint``
(``sharded.py``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
import warnings
from typing import Any, Callable

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from autockpt_core import BufferPool, CheckpointSession, PreemptionHandler, PreemptionRecord, Snapshot
from autockpt_core.preemption_sources import preemption_for
from autockpt_core.callback_settings import CallbackSettings
from autockpt_core.checkpoint_event import CheckpointEvent
from autockpt_core.fit_driver import Due, FitDriver, FitRecords
from autockpt_core.persist import storage_for
from autockpt_torch import TorchSnapshotter, torch_buffer_pool, torch_shared_pool
from autockpt_torch.cuda_api import queue_busy_probe
from autockpt_torch.process_write import WRITE_RECORDS, portable_tree_write
from autockpt_torch.staging import optimizer_owned

from . import internals, native_checkpointing
from . import resume as _resume
from .auto_resume import CONTINUES_EXACTLY, EPOCHS_DONE, NOT_EXACT, apply_exact_state, load_newest
from .buffer_warmup import BufferWarmup
from .checkpoint_file import FRAMEWORK, SUFFIX, latest_checkpoint
from .distributed import LightningRanks, check_strategy, warn_if_slurm_requeue
from .planned_end import planned_end_step
from .progress_counters import NOT_STARTED, Counter, epoch_counter, step_counter
from .sharded import ShardedSave, check_sharded_config, is_sharded
from .signals import hand_back, take_sigterm
from .step_loss import float_loss
from .trust_check import FirstCheckpointCheck
from .validation_watch import ValidationWatch

__all__ = ["AutoCheckpoint", "CheckpointEvent", "PreemptionRecord", "latest_checkpoint"]

log = logging.getLogger("autockpt")

SHARDED_WAIT_ON_FAILURE_S = 60.0
"""After a failure, how long a rank waits for its sharded save in flight (see ``_drain``)."""


class AutoCheckpoint(CallbackSettings, FitRecords, Callback):
    """Checkpoint automatically within an overhead budget, and resume automatically.

    Usage::

        trainer = Trainer(callbacks=[AutoCheckpoint("ckpts", overhead_budget="2%")])
        trainer.fit(model, datamodule)   # rerun the same script: it resumes

    The keywords are :class:`~autockpt_core.callback_settings.CallbackSettings`' (the fields
    of :class:`autockpt_core.Config`, ``config``, ``save_on_train_end``, ``storage``), so a
    LightningCLI YAML can say ``class_path: autockpt_lightning.AutoCheckpoint`` with
    ``init_args``; :meth:`from_config` reads a YAML or TOML file.

    Checkpoints are standard Lightning ``.ckpt`` files (``trainer.fit(ckpt_path=...)`` and
    ``LightningModule.load_from_checkpoint`` accept them) named ``ckpt-step<N>.ckpt`` in
    ``dirpath``, listed with checksums in ``autockpt-manifest.json``. A ``ModelCheckpoint`` may stay
    (its saves' time is in the summary; the default one is warned about: native_checkpointing.py).

    ``save_on_train_end`` (default True): when ``fit()`` ends normally, checkpoint the trained
    model, so ``latest_checkpoint(dirpath)`` is the final weights and rerunning the finished
    command trains nothing (and says so). Lightning does not continue bitwise exactly from an
    epoch's end, so a rerun with more epochs continues from the checkpoint before a final one
    taken there (those steps are trained again), or warns when none is left.

    Attributes (global rank 0, for the current or last fit):
        events: the checkpoints taken, as :class:`CheckpointEvent` records.
        resumed_from: the step auto-resume restored, or None.
        preempted: a :class:`PreemptionRecord` after a signal, else None.
        session: the :class:`CheckpointSession` (estimates, last decision, summary).
    """

    def _init_adapter(self) -> None:
        """The callback's own state (after :class:`CallbackSettings` set ``config``)."""
        self._session: CheckpointSession | None = None
        self._driver: FitDriver | None = None  # per fit, every rank
        self._trainer: pl.Trainer | None = None
        self._snapshotter = TorchSnapshotter(self.config.snapshot_mode)  # new per fit, on rank 0
        self._warmup, self._trust = BufferWarmup(), FirstCheckpointCheck(True)  # new per fit
        self._sharded: ShardedSave | None = None  # every rank, per fit, under a sharded strategy
        self._restore_state: dict[str, Any] | None = None  # from load_state_dict, applied in on_train_start
        self._rng_for_save: dict[int, dict[str, Any]] | None = None
        self._preemption: PreemptionHandler | None = None
        self._validation = ValidationWatch(_resume.gather_rng)  # a signal during validation
        self._last_step: int | None = None
        self._step_end: Callable[..., None] = self._before_fit  # the driver's, from on_fit_start
        self._unclean: bool | Callable[[], bool] = False
        self._prepare: Callable[[CheckpointSession], None] | None = None
        self._steps: Counter = NOT_STARTED  # global_step and current_epoch, from on_train_start
        self._epochs: Counter = NOT_STARTED
        self._step_epoch: int | None = None  # the 0-based epoch the last optimizer step was trained in
        self._warned_loaders = False
        self._hidden_lightning_warning: tuple[Any, ...] | None = None

    @property
    def session(self) -> CheckpointSession | None:
        """The session of the current (or last) fit on global rank 0; None elsewhere or before fit."""
        return self._session

    # -- Lightning hooks -----------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            internals.check_internals(trainer)  # a Lightning that renamed what autockpt reads
            check_strategy(trainer)
            if is_sharded(trainer):
                check_sharded_config(self.config, self._storage)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        previous = self._session
        self._trainer = trainer
        self._sharded = ShardedSave() if is_sharded(trainer) else None  # a collective: every rank
        self._session = self._new_session() if trainer.is_global_zero else None
        native_checkpointing.watch_native_checkpointing(trainer, self._session)  # ModelCheckpoint's saves
        self._warmup, self._trust = BufferWarmup(), FirstCheckpointCheck(self.config.allow_pickle)
        if self._session is not None and previous is not None and trainer.global_step > 0:
            # A second fit() continues the trainer in memory: the same run, for retention.
            self._session.run = previous.run
        self._start_preemption(trainer)  # a signal during the resume or the sanity check counts too
        driver = self._driver = FitDriver(
            self.config, LightningRanks(trainer), self._session, self._take,
            save_on_train_end=self.save_on_train_end, preemption=self._preemption, signals_wait=True,
            publish=None if self.config.log_metrics is False else self._publish,
            drain=self._drain, nothing_left=self._nothing_left,
            device_busy=queue_busy_probe(trainer.strategy.root_device), loss_of=float_loss,
        )  # fmt: skip
        self._step_end = driver.step_end
        writes = driver.writes
        self._unclean = (lambda: not _resume.at_clean_boundary(trainer)) if writes else False
        self._prepare = self._warm_buffers if writes and self._sharded is None else None  # DCP: its own buffers
        if self.config.resume:
            config = self.config
            storage = self._session.storage if self._session is not None else None
            storage = storage or self._storage or storage_for(config.dirpath, config.storage_options)
            resumed = load_newest(
                trainer, driver, storage, config.verbose, config.storage_options, config.allow_pickle,
                sharded=self._sharded is not None,  # every rank verifies its own files of a sharded checkpoint
            )  # fmt: skip
            if resumed is not None:
                driver.resumed(resumed)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        driver = self._require_driver()
        state, self._restore_state = self._restore_state, None  # samplers, then RNG: nothing may draw after it
        check_loaders, self._warned_loaders = not self._warned_loaders, True
        hidden = apply_exact_state(trainer, state, driver.resumed_from, check_loaders)
        if hidden is not None:
            self._hidden_lightning_warning = hidden
        self._last_step = trainer.global_step
        self._step_epoch = None
        self._steps, self._epochs = step_counter(trainer), epoch_counter(trainer)
        driver.begin(trainer.global_step)
        driver.expect_end(planned_end_step(trainer))
        driver.boundary(trainer.global_step)  # a signal during the resume
        self._validation.watch(trainer)

    def state_dict(self) -> dict[str, Any]:
        """Generator states per rank and ResumableSampler positions (inside dump_checkpoint)."""
        if self._trainer is None:
            return {}
        rng, self._rng_for_save = self._rng_for_save, None
        return _resume.callback_state(self._trainer, rng)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the entry until ``on_train_start`` (the data iterators are created in between)."""
        self._restore_state = dict(state_dict) if state_dict else None

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = self._steps.completed  # trainer.global_step
        if step == self._last_step:  # accumulating gradients: no optimizer step in this batch
            return
        self._last_step = step
        self._step_epoch = self._epochs.completed  # current_epoch; at train end it counts the epochs done
        # the driver notes the raw outputs; _loss_of and the other callables run only at a decision
        self._step_end(step, outputs, self._unclean, self._prepare)

    def on_validation_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        """A signal during validation or the sanity check is acted on now (validation_watch.py)."""
        if self._driver is not None:
            self._driver.outside_step(trainer.global_step)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """The weights may not change before an overlapping snapshot copy holds them
        (``snapshot_mode`` "overlap"/"device"): wait for it here (a no-op otherwise)."""
        driver = self._driver
        if driver is None or (self._sharded is None and not (self._session is not None and self._session.copy_pending)):
            return  # nothing overlaps this step (the usual case: one attribute read)
        if self._sharded is not None:
            start = time.perf_counter()
            self._sharded.before_update()  # every rank's own staging copy
            driver.add_blocked(time.perf_counter() - start)
        if self._session is not None:
            driver.add_blocked(self._session.before_update())

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The final checkpoint (unless the newest one holds this step), then finish."""
        driver = self._require_driver()
        # Not bitwise at an epoch's end (at_clean_boundary): a rerun with more epochs resumes before it
        driver.final(trainer.global_step, unclean=driver.writes and not _resume.at_clean_boundary(trainer))
        driver.finish()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Uninstall the handlers; finish a fit that trained nothing; act on a late signal."""
        self._stop_preemption(trainer)
        if self._driver is not None:
            self._driver.finish()  # when training was skipped: release the session
            self._driver.end(trainer.global_step)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop_preemption(trainer)
        if self._driver is not None:
            self._driver.abandon()

    # -- what the driver calls -----------------------------------------------------------------

    def _take(self, due: Due) -> CheckpointEvent | None:
        """Every rank: the checkpoint of ``due.step``, with every rank's generator states."""
        trainer = self._require_trainer()
        meta: dict[str, Any] = {EPOCHS_DONE: trainer.current_epoch}
        if due.final:
            meta[CONTINUES_EXACTLY] = due.exact
        if self._validation.inexact is not None:  # a signal during validation (validation_watch.py)
            meta[NOT_EXACT] = self._validation.inexact
        epoch = self._step_epoch if self._step_epoch is not None else trainer.current_epoch
        # read by state_dict() inside dump_checkpoint; during validation, those of the step's end
        self._rng_for_save = self._validation.rng or _resume.gather_rng(trainer)
        try:
            return self._save(trainer, due.step, epoch, due.reason, meta)
        finally:
            self._rng_for_save = None

    def _warm_buffers(self, session: CheckpointSession) -> None:
        self._warmup.after_step(self._require_trainer(), session.buffers)

    def _publish(self, metrics: dict[str, float]) -> None:
        """interval_steps, stall_ms, overhead_pct and the count, to every logger (rank 0), on
        checkpoints and interval changes: directly, so ``log_every_n_steps`` drops none."""
        trainer = self._require_trainer()
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def _drain(self, failed: bool) -> bool:
        """This rank's last shards written (sharded models). After a failure, a rank that died
        would hold the others' saves in DCP's collectives until the group's timeout: wait a
        minute at most, and then not for the session (its commit waits for the same save)."""
        if self._sharded is None:
            return True
        try:
            self._sharded.close(timeout=SHARDED_WAIT_ON_FAILURE_S if failed else None)
        except concurrent.futures.TimeoutError:
            log.error("autockpt: the sharded checkpoint in flight when training failed was not written")
            return False
        return True

    def _nothing_left(self) -> str:
        trainer = self._require_trainer()
        return (
            f"autockpt: nothing left to train: the checkpoint of step {self.resumed_from} already "
            f"reached the end of this fit (max_epochs={trainer.max_epochs}, max_steps={trainer.max_steps}); "
            "raise max_epochs or max_steps to train on"
        )

    # -- internals -----------------------------------------------------------------------------

    def _new_session(self) -> CheckpointSession:
        self._snapshotter = TorchSnapshotter(self.config.snapshot_mode)
        return CheckpointSession(
            self.config,
            framework=FRAMEWORK,
            suffix=SUFFIX,
            buffers=torch_buffer_pool(),
            storage=self._storage,
            # sharded checkpoints are written by DCP's threads on every rank, never a persist process
            shared_buffers=torch_shared_pool if self._sharded is None else None,
            persist_modules=(WRITE_RECORDS.partition(":")[0],),
            gpu=torch.cuda.is_available(),
            on_checkpoint_cost=self._snapshotter.record_cost,  # snapshot_mode "auto" measures
        )

    def _start_preemption(self, trainer: pl.Trainer) -> None:
        """Install the handlers (main thread); take SIGTERM over from Lightning (``signals.py``)."""
        self._stop_preemption(trainer)  # left from an earlier fit that did not end through our hooks
        self._preemption = preemption_for(self.config)
        if self._preemption is not None and self._preemption.install():
            if "SIGTERM" in self._preemption.signals:
                take_sigterm(trainer)
            warn_if_slurm_requeue(trainer)

    def _stop_preemption(self, trainer: pl.Trainer | None) -> None:
        self._validation.stop()
        if trainer is not None:
            hand_back(trainer, self._preemption)
        elif self._preemption is not None:
            self._preemption.uninstall()
        if self._hidden_lightning_warning is not None:
            with contextlib.suppress(ValueError):
                warnings.filters.remove(self._hidden_lightning_warning)  # type: ignore[attr-defined]
                getattr(warnings, "_filters_mutated", lambda: None)()
            self._hidden_lightning_warning = None

    def _save(
        self, trainer: pl.Trainer, step: int, epoch: int, reason: str, meta: dict[str, Any]
    ) -> CheckpointEvent | None:
        connector = internals.checkpoint_connector(trainer)
        session = self._session
        if self._sharded is not None:
            taken = self._sharded.checkpoint(trainer, session, step, epoch, reason, meta)
            if session is None or taken is None:
                return None
            return CheckpointEvent.after_save(session, step, epoch, reason, *taken)
        if session is None:  # other ranks take part in the collectives of dump_checkpoint
            connector.dump_checkpoint(weights_only=False)
            return None
        copied_bytes = 0

        def snapshot(buffers: BufferPool[Any]) -> Snapshot:
            nonlocal copied_bytes
            # dump_checkpoint's live references are copied before the hook returns, or ("overlap",
            # "device") during the next step, whose on_before_optimizer_step waits for the copy
            deferrable = optimizer_owned(trainer.lightning_module.parameters(), trainer.optimizers)
            snapshotter = self._snapshotter
            with self._validation.inside_batch(trainer):  # a signal during validation: see there
                dumped = connector.dump_checkpoint(weights_only=False)
            tree, copied_bytes, pending = snapshotter.snapshot(dumped, buffers, deferrable)
            self._trust.check(tree, step)  # the first checkpoint: would a weights-only resume load it?
            portable = portable_tree_write(tree, WRITE_RECORDS)  # torch.save(tree, file) in either persist mode
            return Snapshot(write=portable.run, nbytes=copied_bytes, pending=pending, mode=snapshotter.mode,
                            portable=portable, hidden_s=snapshotter.hidden_s)  # CUDA: the queue's drain

        stall = session.save(step, epoch, snapshot, meta=meta, reason=reason)
        return CheckpointEvent.after_save(session, step, epoch, reason, stall, copied_bytes)

    def _before_fit(self, *args: Any, **kwargs: Any) -> None:
        self._require_driver()

    def _require_driver(self) -> FitDriver:
        if self._driver is None:
            raise RuntimeError("AutoCheckpoint hooks ran before on_fit_start; use it through Trainer.fit().")
        return self._driver

    def _require_trainer(self) -> pl.Trainer:
        if self._trainer is None:
            raise RuntimeError("AutoCheckpoint hooks ran before on_fit_start; use it through Trainer.fit().")
        return self._trainer

