"""``AutoCheckpoint``: the Lightning callback that drives a :class:`CheckpointSession`.

The callback only maps Lightning hooks to session calls; when to checkpoint is decided by the
core policy. Call order (all on the training thread)::

    __init__            build and validate the Config (a bad value raises ConfigError here)
    setup("fit")        check the strategy is supported (single device, DDP, ModelParallelStrategy)
    on_fit_start        create the session (global rank 0); install the preemption signal
                        handlers and take SIGTERM over from Lightning's signal connector
                        (signals.py: its handler would stop training before the emergency
                        checkpoint and run a collective inside the handler); when fit() got
                        no ckpt_path and resume=True, restore the newest valid checkpoint
                        (all ranks; an error on any rank is raised on every rank)
    load_state_dict     (inside the restore) keep this callback's entry: RNG states per rank,
                        ResumableSampler positions, batches Lightning fetched ahead
    on_train_start      apply that entry (samplers first, RNG last: the train iterator was
                        created after the restore and drew from the generators);
                        session.start(global_step); a signal that arrived during the resume
                        or the sanity check ends the run here (nothing trained to save)
    on_train_batch_end  once per optimizer step (global_step advanced; gradient accumulation
                        skips the other batches): session.step_end(step, loss); under DDP one
                        all-reduce carries rank 0's decision, any rank's signal and any rank's
                        failure (distributed.py); when it says save: session.save(...), whose
                        snapshot callable runs dump_checkpoint() and copies every tensor into
                        the session's reusable host buffers before the hook returns
                        (snapshot_mode "overlap" and "device": parameters and optimizer state
                        are copied during the next step instead); torch.save() of that copy
                        runs in the session's persist process (persist_mode "process", the
                        default on Linux without CUDA) or background writer thread
    on_before_optimizer_step  session.before_update(): the next optimizer step waits for an
                        overlapping copy (CheckFreq's rule; nothing to wait for in "sync")
    on_train_batch_end  (also) BufferWarmup: at the first step, and when the optimizers' state
                        grew, the session's buffers for the coming checkpoints are allocated
                        and faulted in by a background thread (no cold start)
    on_train_batch_end  (also) a checkpoint due at the last batch of an epoch or right before
                        validation is taken one step later (Lightning cannot resume exactly
                        from there; rank 0 decides); after a signal: an emergency checkpoint
                        of this step, committed (durable) before going on, then Preempted
                        (exit status 128 + signal number) or training continues
                        (config.on_preempt). A signal during validation or at an epoch's end
                        is acted on at the next step boundary the same way (validation runs
                        to its end; a second signal terminates the process at once)
    state_dict          (inside dump_checkpoint) RNG of every rank (gathered before the dump),
                        sampler positions = batches training finished × batch size
    on_train_end        the final checkpoint of the trained model (save_on_train_end; not
                        when the newest checkpoint already holds this step or the last loss
                        is NaN/inf); session.finish() (waits for the last persist, raises
                        its error on every rank); the summary line when verbose
    on_fit_end          uninstall the signal handlers; a rerun that had nothing left to train
                        says so; a signal that came after the last step still ends the run
                        with 128 + signal number (the trained model is committed)
    on_exception        uninstall the signal handlers; wait for the in-flight persist; a
                        persist error is logged and never replaces the exception that stopped
                        training

Exact resume (docs/reliability.md): with the same seed and deterministic settings, a run that
is killed and rerun ends with the same weights, bit for bit, as one that never stopped, when
the train loader is stateful (torchdata ``StatefulDataLoader``) or a ``DataLoader`` with a
:class:`~autockpt_torch.ResumableSampler`. Cases that cannot be exact are detected in
``on_train_start`` and reported with a ``ResumeNotExactWarning`` naming the reason.

Distributed training: only global rank 0 owns a session, measures, decides and writes. Every
other rank follows: the decision is agreed with one small all-reduce per optimizer step and
all ranks call ``dump_checkpoint`` together (as ``trainer.save_checkpoint`` requires), but
only rank 0 copies and writes. The resume path is broadcast from rank 0. A signal that reaches
any one rank stops every rank at the same step after one committed checkpoint; an error on
any one rank (a persist error, a bad manifest, a failed allocation) is raised on every rank
(:class:`~autockpt_core.policy.process_group.PeerFailedError` on the others, with its message).
Sharded models (``ModelParallelStrategy``: FSDP2, tensor parallelism): every rank writes its own
shards in the background through ``torch.distributed.checkpoint`` and rank 0 commits them as
one directory (``sharded.py``); ``dirpath`` must then be a directory every rank writes.
Limitations: ``FSDPStrategy`` (FSDP1) and DeepSpeed are refused; ``dirpath`` must be readable
by every rank for resume. Tested on one process and on two CPU processes (gloo: DDP, and
FSDP2 under ModelParallelStrategy).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import signal
import time
import warnings
from typing import Any, Mapping

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from autockpt_core import (
    BufferPool,
    CheckpointSession,
    Decision,
    Preempted,
    PreemptionHandler,
    PreemptionRecord,
    Snapshot,
)
from autockpt_core.callback_settings import CallbackSettings
from autockpt_core.checkpoint_event import CheckpointEvent
from autockpt_core.emergency import commit_emergency
from autockpt_core.persist import storage_for
from autockpt_core.persist.failures import unfinished_message
from autockpt_core.policy.rank_timing import StepClock
from autockpt_torch import TorchSnapshotter, torch_buffer_pool, torch_shared_pool
from autockpt_torch.process_write import WRITE_RECORDS, portable_tree_write
from autockpt_torch.staging import optimizer_owned

from . import resume as _resume
from .auto_resume import CONTINUES_EXACTLY, FINAL_REASON, apply_exact_state, load_newest
from .buffer_warmup import BufferWarmup
from .checkpoint_file import FRAMEWORK, SUFFIX, latest_checkpoint
from .distributed import (
    LightningRanks,
    check_strategy,
    raise_if_any_failed,
    warn_if_slurm_requeue,
)
from .sharded import ShardedSave, check_sharded_config, is_sharded
from .signals import hand_back, take_sigterm

__all__ = ["AutoCheckpoint", "CheckpointEvent", "PreemptionRecord", "latest_checkpoint"]

log = logging.getLogger("autockpt")

SHARDED_WAIT_ON_FAILURE_S = 60.0
"""After a failure, how long a rank waits for its sharded save in flight (see _finish_session)."""


class AutoCheckpoint(CallbackSettings, Callback):
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
    ``dirpath``, listed with checksums in ``autockpt-manifest.json``. The default
    ``ModelCheckpoint`` can stay enabled: the two never touch each other's files.

    ``save_on_train_end`` (default True): when ``fit()`` ends normally, checkpoint the trained
    model, so ``latest_checkpoint(dirpath)`` is the final weights and rerunning the finished
    command trains nothing (and says so). Lightning does not continue bitwise exactly from an
    epoch's end, so a rerun with more epochs continues from the checkpoint before a final one
    taken there (those steps are trained again), or warns when none is left.

    Attributes (global rank 0, for the current or last fit):
        events: the checkpoints taken, as :class:`CheckpointEvent` records.
        resumed_from: the step auto-resume restored, or None.
        session: the :class:`CheckpointSession` (estimates, last decision, summary).
    """

    def _init_adapter(self) -> None:
        """The callback's own state (after :class:`CallbackSettings` set ``config``)."""
        self._session: CheckpointSession | None = None
        self._snapshotter = TorchSnapshotter(self.config.snapshot_mode)  # new per fit, on rank 0
        self._warmup = BufferWarmup()  # new per fit
        self._sharded: ShardedSave | None = None  # every rank, per fit, under a sharded strategy
        self._restore_state: dict[str, Any] | None = None  # from load_state_dict, applied in on_train_start
        self._rng_for_save: dict[int, dict[str, Any]] | None = None
        self._preemption: PreemptionHandler | None = None
        self._warned_loaders = False
        self._hidden_lightning_warning: tuple[Any, ...] | None = None
        self._reset_fit_state(None)

    def _reset_fit_state(self, trainer: pl.Trainer | None) -> None:
        """What one fit() records: set in ``__init__`` and again in ``on_fit_start``.

        Not reset here: ``_restore_state`` (Lightning may call ``load_state_dict`` before
        ``on_fit_start``), the session (created by ``on_fit_start``) and what lives for the
        callback's lifetime (warned once, installed handlers).
        """
        self._finished = False
        self._last_step: int | None = None
        self._logged_interval: int | None = None
        self.events: list[CheckpointEvent] = []
        self.resumed_from: int | None = None
        self.preempted: PreemptionRecord | None = None
        self._trainer: pl.Trainer | None = trainer
        self._deferred_from: int | None = None  # a checkpoint due at an unclean boundary ...
        self._deferred_reason: str | None = None  # ... is taken at the next step
        self._trained = False  # an optimizer step ran in this fit
        self._saved_step: int | None = None  # the step of the newest checkpoint (saved or resumed)
        self._last_loss: float | None = None
        self._step_clock = StepClock()  # this rank's step times, combined over ranks in the agreement

    @property
    def session(self) -> CheckpointSession | None:
        """The session of the current (or last) fit on global rank 0; None elsewhere or before fit."""
        return self._session

    # -- Lightning hooks -----------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            check_strategy(trainer)
            if is_sharded(trainer):
                check_sharded_config(self.config, self._storage)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        previous = self._session
        self._sharded = ShardedSave() if is_sharded(trainer) else None  # a collective: every rank
        self._session = self._new_session() if trainer.is_global_zero else None
        self._warmup = BufferWarmup()
        if self._session is not None and previous is not None and trainer.global_step > 0:
            # A second fit() continues the trainer in memory: the same run, for retention.
            self._session.run = previous.run
        self._reset_fit_state(trainer)
        self._start_preemption(trainer)  # a signal during the resume or the sanity check counts too
        if self.config.resume:
            sharded = None  # every rank verifies its own files of a sharded checkpoint
            if self._sharded is not None:
                sharded = self._storage or storage_for(self.config.dirpath)
            self.resumed_from = load_newest(
                trainer, self._session, self.config.verbose, self.config.storage_options, self.config.allow_pickle,
                sharded=sharded,
            )  # fmt: skip
        self._saved_step = self.resumed_from

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Samplers, then RNG: nothing may draw after it.
        state, self._restore_state = self._restore_state, None
        check_loaders, self._warned_loaders = not self._warned_loaders, True
        hidden = apply_exact_state(trainer, state, self.resumed_from, check_loaders)
        if hidden is not None:
            self._hidden_lightning_warning = hidden
        self._last_step = trainer.global_step
        if self._session is not None:
            self._session.start(trainer.global_step)
        self._step_clock.start()
        signum = self._signum()
        if trainer.world_size > 1 and self.config.signals:
            signum = LightningRanks(trainer).agree(signum=signum).signum
        if signum is not None:  # during the resume or the sanity check: nothing trained yet
            self._on_preempted(trainer, trainer.global_step, signum, saved=False)

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
        step = trainer.global_step
        if step == self._last_step:  # accumulating gradients: no optimizer step in this batch
            return
        self._last_step = step
        self._trained = True
        times = self._step_clock.lap()
        session = self._session
        decision: Decision | None = None
        error: BaseException | None = None
        if session is not None:
            self._last_loss = _loss_value(outputs)
            try:
                decision = session.step_end(step, loss=self._last_loss)
            except Exception as exc:  # a background write error: every rank stops with it
                error = exc
            if self._sharded is None:  # DCP stages sharded checkpoints into its own buffers
                self._warmup.after_step(trainer, session.buffers)
        save = decision is not None and decision.save
        reason = decision.reason if decision is not None else ""
        signum = self._signum()
        # Decided once, on rank 0, and agreed: ranks never disagree on where a checkpoint goes.
        unclean = trainer.is_global_zero and not _resume.at_clean_boundary(trainer)
        # rank 0 decides; the others follow; any rank may be signalled or fail (one rank: local)
        agreed = LightningRanks(trainer).settle(error, save=save, unclean=unclean, signum=signum, times=times)
        save, unclean, signum = agreed.save, agreed.unclean, agreed.signum
        if session is not None and trainer.world_size > 1:
            session.combine_ranks(agreed.slowest)  # the interval suits the slowest rank
        deferred_from, deferred_reason = self._deferred_from, self._deferred_reason
        self._deferred_from = self._deferred_reason = None
        if deferred_reason is not None and not save:
            save, reason = True, f"{deferred_reason} (deferred from step {deferred_from})"
        if (save or signum is not None) and deferred_from is None and unclean:
            # Lightning cannot resume exactly from the last batch of an epoch or from right
            # before a validation run: take this checkpoint one step later (same on all ranks).
            self._deferred_from, self._deferred_reason = step, (reason if save else None)
            save, signum = False, None
        if save:
            self._checkpoint(trainer, step, reason)
        elif session is not None and decision is not None and decision.interval is not None:
            if decision.interval.steps != self._logged_interval:
                self._log_metrics(trainer, session)
        if signum is not None:
            self._on_preempted(trainer, step, signum, saved=save)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The final checkpoint (unless the newest one holds this step), or with
        ``save_on_train_end=False`` a checkpoint still due, then finish the session."""
        step = trainer.global_step
        deferred = self._deferred_reason  # a checkpoint put off to a step that never came
        reason = deferred if deferred is not None and not self.save_on_train_end else FINAL_REASON
        final = (self.save_on_train_end or deferred is not None) and self._trained and step != self._saved_step
        loss = self._last_loss
        if final and trainer.is_global_zero and loss is not None and not math.isfinite(loss):
            warnings.warn(
                f"autockpt: no final checkpoint: the last loss is {loss}; the newest checkpoint stays "
                f"step {self._saved_step}",
                RuntimeWarning,
                stacklevel=2,
            )
            final = False
        # At an epoch's end Lightning does not continue bitwise exactly (see at_clean_boundary):
        # a rerun with more epochs resumes from the checkpoint before this one (auto_resume.py).
        unclean = trainer.is_global_zero and not _resume.at_clean_boundary(trainer)
        if trainer.world_size > 1:
            agreed = LightningRanks(trainer).agree(save=final, unclean=unclean)
            final, unclean = agreed.save, agreed.unclean
        self._deferred_from = self._deferred_reason = None
        if final:
            self._checkpoint(trainer, step, reason, meta={CONTINUES_EXACTLY: not unclean})
        self._finish_session(trainer, raise_errors=True)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Uninstall the handlers; report a rerun that had nothing left to train; act on a late signal."""
        late_signal = self._signum()
        self._stop_preemption(trainer)
        if not self._trained and self.resumed_from is not None and trainer.is_global_zero:
            message = (
                f"autockpt: nothing left to train: the checkpoint of step {self.resumed_from} already "
                f"reached the end of this fit (max_epochs={trainer.max_epochs}, max_steps={trainer.max_steps}); "
                "raise max_epochs or max_steps to train on"
            )
            log.info(message)
            if self.config.verbose:
                print(message, flush=True)
        self._finish_session(trainer, raise_errors=True)  # when training was skipped: release it
        if late_signal is not None and self.config.on_preempt == "exit":
            # The signal came after the last step: training is complete and committed.
            raise Preempted(late_signal, trainer.global_step)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop_preemption(trainer)
        self._finish_session(trainer, raise_errors=False)

    # -- internals -----------------------------------------------------------------------------

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """The weights may not change before an overlapping snapshot copy holds them
        (``snapshot_mode`` "overlap"/"device"): wait for it here (a no-op otherwise)."""
        if self._sharded is not None:
            start = time.perf_counter()
            self._sharded.before_update()  # every rank's own staging copy
            self._step_clock.add_blocked(time.perf_counter() - start)
        if self._session is not None:
            self._step_clock.add_blocked(self._session.before_update())

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

    def _finish_session(self, trainer: pl.Trainer, raise_errors: bool) -> None:
        """Wait for the last persist and summarise (rank 0); once per fit.

        ``raise_errors``: a persist error is raised on every rank (normal end), or only
        logged, never replacing the exception that stopped training (``on_exception``).
        """
        if self._finished:
            return
        self._finished = True
        session = self._session
        error: BaseException | None = None
        if self._sharded is not None:
            # This rank's last shards written. After a failure, a rank that died would hold the
            # others' saves in DCP's collectives until the group's timeout: wait a minute at most.
            try:
                self._sharded.close(timeout=None if raise_errors else SHARDED_WAIT_ON_FAILURE_S)
            except concurrent.futures.TimeoutError:
                log.error("autockpt: the sharded checkpoint in flight when training failed was not written")
                session = None  # its commit waits for the same save: not waited for either
            except Exception as exc:
                error = exc
        if session is not None:
            try:
                summary = session.finish()  # waits for the last persist; raises CheckpointWriteError
            except Exception as exc:
                error = error or exc
            else:
                self._log_metrics(trainer, session)
                if self.config.verbose and self._trained and raise_errors:
                    print(summary.line(), flush=True)
        if not raise_errors:
            if error is not None:
                log.error("%s", unfinished_message(error, self.config.dirpath))
            return
        raise_if_any_failed(trainer, error)

    def _checkpoint(self, trainer: pl.Trainer, step: int, reason: str, meta: dict[str, Any] | None = None) -> None:
        """``_save`` with every rank's generator states gathered first; all ranks call this.

        A failure on any rank (allocating the buffers, a previous persist's error) is raised on
        every rank.
        """
        start = time.perf_counter()
        # read by state_dict() inside dump_checkpoint
        self._rng_for_save = _resume.gather_rng(trainer)
        error: BaseException | None = None
        try:
            self._save(trainer, step, reason, meta)
        except Exception as exc:
            error = exc
        finally:
            self._rng_for_save = None
        raise_if_any_failed(trainer, error)
        self._saved_step = step
        # this rank's whole time in the checkpoint, its collectives included (the profiler's stall
        # on rank 0 is the copy alone): carried in the next agreement, the slowest rank's counts
        self._step_clock.add_blocked(time.perf_counter() - start)

    def _signum(self) -> int | None:
        return self._preemption.signum if self._preemption is not None else None

    def _on_preempted(self, trainer: pl.Trainer, step: int, signum: int, saved: bool) -> None:
        """A signal arrived: commit a checkpoint of this step (durable), then exit or continue.

        All ranks call this at the same point (the signal was agreed); nothing is saved when
        the newest checkpoint already holds this step (or nothing was trained yet).
        """
        name = signal.Signals(signum).name
        if not saved and step != self._saved_step and (self._trained or self.resumed_from is not None):
            self._checkpoint(trainer, step, f"preempted by {name}")
        error: BaseException | None = None
        try:
            self.preempted = commit_emergency(
                self._session, step, signum, on_preempt=self.config.on_preempt, verbose=self.config.verbose
            )
        except Exception as exc:
            error = exc
        raise_if_any_failed(trainer, error)
        if self.config.on_preempt == "exit":
            self._stop_preemption(trainer)
            raise Preempted(signum, step)
        if self._preemption is not None:
            self._preemption.clear()

    def _start_preemption(self, trainer: pl.Trainer) -> None:
        """Install the handlers (main thread); take SIGTERM over from Lightning (``signals.py``)."""
        self._stop_preemption(trainer)  # left from an earlier fit that did not end through our hooks
        self._preemption = PreemptionHandler(self.config.signals) if self.config.signals else None
        if self._preemption is not None and self._preemption.install():
            if "SIGTERM" in self._preemption.signals:
                take_sigterm(trainer)
            warn_if_slurm_requeue(trainer)

    def _stop_preemption(self, trainer: pl.Trainer | None) -> None:
        if trainer is not None:
            hand_back(trainer, self._preemption)
        elif self._preemption is not None:
            self._preemption.uninstall()
        if self._hidden_lightning_warning is not None:
            with contextlib.suppress(ValueError):
                warnings.filters.remove(self._hidden_lightning_warning)  # type: ignore[attr-defined]
                getattr(warnings, "_filters_mutated", lambda: None)()
            self._hidden_lightning_warning = None

    def _save(self, trainer: pl.Trainer, step: int, reason: str, meta: dict[str, Any] | None = None) -> None:
        connector = trainer._checkpoint_connector
        session = self._session
        if self._sharded is not None:
            taken = self._sharded.checkpoint(trainer, session, step, reason, meta)
            if session is not None and taken is not None:
                self._record_event(trainer, session, step, reason, *taken)
            return
        if session is None:  # other ranks take part in the collectives of dump_checkpoint
            connector.dump_checkpoint(weights_only=False)
            return
        copied_bytes = 0

        def snapshot(buffers: BufferPool[Any]) -> Snapshot:
            nonlocal copied_bytes
            # dump_checkpoint returns live references: what the next step may change is copied
            # before returning from the hook; with snapshot_mode "overlap"/"device", parameters
            # and optimizer state are copied during the next step, which waits for that copy in
            # on_before_optimizer_step.
            deferrable = optimizer_owned(trainer.lightning_module.parameters(), trainer.optimizers)
            snapshotter = self._snapshotter
            tree, copied_bytes, pending = snapshotter.snapshot(
                connector.dump_checkpoint(weights_only=False), buffers, deferrable
            )
            # With the zip's own per-record CRC-32 (a second pass in the writer thread, on top
            # of the manifest's): without it zip tools reject the file (docs/benchmarks.md).
            portable = portable_tree_write(tree, WRITE_RECORDS)  # torch.save(tree, file) in either persist mode
            return Snapshot(write=portable.run, nbytes=copied_bytes, pending=pending, mode=snapshotter.mode, portable=portable)

        stall = session.save(step, trainer.current_epoch, snapshot, meta=meta, reason=reason)
        self._record_event(trainer, session, step, reason, stall, copied_bytes)

    def _record_event(
        self, trainer: pl.Trainer, session: CheckpointSession, step: int, reason: str, stall: float, nbytes: int
    ) -> None:
        self.events.append(CheckpointEvent.after_save(session, step, trainer.current_epoch, reason, stall, nbytes))
        self._log_metrics(trainer, session)

    def _log_metrics(self, trainer: pl.Trainer, session: CheckpointSession) -> None:
        """Send interval_steps, stall_ms, overhead_pct and the count to every logger (rank 0).

        Called on checkpoints and when the interval changes, not every step; written directly
        to the loggers so the values are not dropped by ``log_every_n_steps``.
        """
        metrics = session.metrics()
        interval = metrics.get("autockpt/interval_steps")
        self._logged_interval = int(interval) if interval is not None else None
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)


def _loss_value(outputs: Any) -> float | None:
    """The scalar loss in ``training_step``'s output (a tensor or a dict with "loss"), if any.

    On CUDA, reading it waits for the step to finish on the device.
    """
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if isinstance(loss, torch.Tensor):
        return float(loss.detach()) if loss.numel() == 1 else None
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss)
    return None


