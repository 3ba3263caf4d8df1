"""``AutoCheckpoint``: the Lightning callback that drives a :class:`CheckpointSession`.

The callback only maps Lightning hooks to session calls; when to checkpoint is decided by the
core policy. Call order (all on the training thread)::

    __init__            build and validate the Config (a bad value raises ConfigError here)
    setup("fit")        check the strategy is supported (single device or DDP)
    on_fit_start        create the session (global rank 0); when fit() got no ckpt_path and
                        resume=True, restore the newest valid checkpoint (all ranks)
    load_state_dict     (inside the restore) keep this callback's entry: RNG states per rank,
                        ResumableSampler positions, batches Lightning fetched ahead
    on_train_start      apply that entry (samplers first, RNG last: the train iterator was
                        created after the restore and drew from the generators);
                        session.start(global_step); install the preemption signal handlers
                        (after Lightning's own, which they chain to)
    on_train_batch_end  once per optimizer step (global_step advanced; gradient accumulation
                        skips the other batches): session.step_end(step, loss); when it says
                        save: session.save(...), whose snapshot callable runs
                        dump_checkpoint() and copies every tensor into the session's reusable
                        host buffers before the hook returns (snapshot_mode "overlap" and
                        "device": parameters and optimizer state are copied during the next
                        step instead); torch.save() of that copy runs in the session's
                        background writer thread, after the copy completed
    on_before_optimizer_step  session.before_update(): the next optimizer step waits for an
                        overlapping copy (CheckFreq's rule; nothing to wait for in "sync")
    on_train_batch_end  (also) a checkpoint due at the last batch of an epoch or right before
                        validation is taken one step later (Lightning cannot resume exactly
                        from there); after a signal: an emergency checkpoint of this step,
                        session.flush() (durable), then raise Preempted (exit status 128 +
                        signal number) or continue (config.on_preempt)
    state_dict          (inside dump_checkpoint) RNG of every rank (gathered before the dump),
                        sampler positions = batches training finished × batch size
    on_train_end        uninstall the signal handlers; session.finish() (waits for the last
                        persist, raises its error), logs
                        the metrics and prints the summary line when verbose
    on_exception        uninstall the signal handlers; waits for the in-flight persist; a
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
only rank 0 copies and writes. The resume path is broadcast from rank 0. Limitations:
sharded strategies (FSDP, DeepSpeed, ModelParallel) are refused, since they write sharded
checkpoints through their own save path; ``dirpath`` must be readable by every rank for
resume; a persist error raised on rank 0 stops rank 0 only and the other ranks rely on the
launcher to tear them down. Tested on one process and on two CPU processes (gloo DDP).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import warnings
from pathlib import Path
from typing import Any, Mapping

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from autockpt_core import (
    BufferPool,
    CheckpointSession,
    Config,
    Decision,
    Preempted,
    PreemptionHandler,
    PreemptionRecord,
    Snapshot,
    Storage,
)
from autockpt_core.config import CONFIG_DEFAULTS, config_from_keywords
from autockpt_core.persist import location_of
from autockpt_core.preemption import exit_code
from autockpt_torch import TorchSnapshotter, save_tree, torch_buffer_pool
from autockpt_torch.staging import optimizer_owned

from . import resume as _resume
from .auto_resume import apply_exact_state, load_newest
from .checkpoint_file import FRAMEWORK, SUFFIX, latest_checkpoint
from .distributed import agree, check_strategy, warn_if_slurm_requeue
from .events import CheckpointEvent

__all__ = ["AutoCheckpoint", "CheckpointEvent", "PreemptionRecord", "latest_checkpoint"]

log = logging.getLogger("autockpt")

# Config's defaults, so the signature below shows (and jsonargparse sees) the real values
# without restating them here.
_DEFAULTS = CONFIG_DEFAULTS


class AutoCheckpoint(Callback):
    """Checkpoint automatically within an overhead budget, and resume automatically.

    Usage::

        trainer = Trainer(callbacks=[AutoCheckpoint("ckpts", overhead_budget="2%")])
        trainer.fit(model, datamodule)   # rerun the same script: it resumes

    Every keyword mirrors a field of :class:`autockpt_core.Config` (see its docstring), so a
    LightningCLI YAML can say ``class_path: autockpt_lightning.AutoCheckpoint`` with
    ``init_args``. Alternatively pass a built ``config``; then the keywords that differ from
    their defaults override it. ``storage`` replaces the storage ``dirpath`` would select
    (tests, custom backends).

    Checkpoints are standard Lightning ``.ckpt`` files (``trainer.fit(ckpt_path=...)`` and
    ``LightningModule.load_from_checkpoint`` accept them) named ``ckpt-step<N>.ckpt`` in
    ``dirpath``, listed with checksums in ``autockpt-manifest.json``. The default
    ``ModelCheckpoint`` can stay enabled: the two never touch each other's files.

    Attributes (global rank 0, for the current or last fit):
        events: the checkpoints taken, as :class:`CheckpointEvent` records.
        resumed_from: the step auto-resume restored, or None.
        session: the :class:`CheckpointSession` (estimates, last decision, summary).
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        *,
        overhead_budget: float | str = _DEFAULTS["overhead_budget"],
        mtbf: float | str | None = _DEFAULTS["mtbf"],
        every_n_steps: int | None = _DEFAULTS["every_n_steps"],
        min_interval: float | str | None = _DEFAULTS["min_interval"],
        max_interval: float | str | None = _DEFAULTS["max_interval"],
        keep_last: int = _DEFAULTS["keep_last"],
        warmup_steps: int = _DEFAULTS["warmup_steps"],
        profile_window: int = _DEFAULTS["profile_window"],
        async_persist: bool = _DEFAULTS["async_persist"],
        resume: bool = _DEFAULTS["resume"],
        schedule: str = _DEFAULTS["schedule"],
        adaptive: bool = _DEFAULTS["adaptive"],
        verbose: bool = _DEFAULTS["verbose"],
        total_steps: int | None = _DEFAULTS.get("total_steps"),
        signals: tuple[str, ...] = _DEFAULTS["signals"],
        on_preempt: str = _DEFAULTS["on_preempt"],
        snapshot_mode: str = _DEFAULTS["snapshot_mode"],
        config: Config | None = None,
        storage: Storage | None = None,
    ) -> None:
        super().__init__()
        # The mirrored Config keywords, by name (the signature lists them for IDEs and LightningCLI).
        values = {name: value for name, value in locals().items() if name in CONFIG_DEFAULTS}
        self.config = config_from_keywords(dirpath, config, values)
        self._storage = storage
        self._session: CheckpointSession | None = None
        self._snapshotter = TorchSnapshotter(self.config.snapshot_mode)  # new per fit, on rank 0
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

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], **overrides: Any) -> "AutoCheckpoint":
        """Build from a YAML or TOML file (see :meth:`Config.from_file`); ``overrides`` win."""
        return cls(config=Config.from_file(path, **overrides))

    @property
    def session(self) -> CheckpointSession | None:
        """The session of the current (or last) fit on global rank 0; None elsewhere or before fit."""
        return self._session

    # -- Lightning hooks -----------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            check_strategy(trainer)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._session = self._new_session() if trainer.is_global_zero else None
        self._reset_fit_state(trainer)
        if self.config.resume:
            self.resumed_from = load_newest(trainer, self._session, self.config.verbose)

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
        # After Lightning's own handlers (registered before the train loop), so ours chain to them.
        self._preemption = PreemptionHandler(self.config.signals) if self.config.signals else None
        if self._preemption is not None:
            self._preemption.install()
            warn_if_slurm_requeue(trainer)

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
        session = self._session
        decision: Decision | None = None
        if session is not None:
            decision = session.step_end(step, loss=_loss_value(outputs))
        save = decision is not None and decision.save
        reason = decision.reason if decision is not None else ""
        signum = self._preemption.signum if self._preemption is not None else None
        if trainer.world_size > 1:  # rank 0 decided; the others follow; any rank may be signalled
            save, signum = agree(trainer, save, signum)
        deferred_from, deferred_reason = self._deferred_from, self._deferred_reason
        self._deferred_from = self._deferred_reason = None
        if deferred_reason is not None and not save:
            save, reason = True, f"{deferred_reason} (deferred from step {deferred_from})"
        if (save or signum is not None) and deferred_from is None and not _resume.at_clean_boundary(trainer):
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
        self._stop_preemption()
        session = self._session
        if session is None or self._finished:
            return
        self._finished = True
        summary = session.finish()  # waits for the last persist; raises CheckpointWriteError
        self._log_metrics(trainer, session)
        if self.config.verbose:
            print(summary.line(), flush=True)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop_preemption()
        session = self._session
        if session is None or self._finished:
            return
        self._finished = True
        try:
            session.finish()  # let the in-flight persist complete: it may be the newest state
        except Exception as err:  # never replace the exception that stopped training
            log.error("autockpt: the checkpoint in flight when training failed was not persisted: %s", err)

    # -- internals -----------------------------------------------------------------------------

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """The weights may not change before an overlapping snapshot copy holds them
        (``snapshot_mode`` "overlap"/"device"): wait for it here (a no-op otherwise)."""
        if self._session is not None:
            self._session.before_update()

    def _new_session(self) -> CheckpointSession:
        self._snapshotter = TorchSnapshotter(self.config.snapshot_mode)
        return CheckpointSession(
            self.config,
            framework=FRAMEWORK,
            suffix=SUFFIX,
            buffers=torch_buffer_pool(),
            storage=self._storage,
        )

    def _checkpoint(self, trainer: pl.Trainer, step: int, reason: str) -> None:
        """``_save`` with every rank's generator states gathered first (all ranks call this)."""
        self._rng_for_save = _resume.gather_rng(trainer)  # read by state_dict() inside dump_checkpoint
        try:
            self._save(trainer, step, reason)
        finally:
            self._rng_for_save = None

    def _on_preempted(self, trainer: pl.Trainer, step: int, signum: int, saved: bool) -> None:
        """A signal arrived: commit a checkpoint of this step (durable), then exit or continue.

        All ranks call this at the same step boundary (the signal was agreed in ``_agree``).
        """
        name = signal.Signals(signum).name
        if not saved:
            self._checkpoint(trainer, step, f"preempted by {name}")
        session = self._session
        path = None
        if session is not None:
            session.flush()  # durable and listed in the manifest before we go on
            record = session.writer.last_record
            path = location_of(session.storage, record.name) if record is not None else None
        if trainer.world_size > 1:
            trainer.strategy.barrier("autockpt-preempted")
        self.preempted = PreemptionRecord(step=step, signal=name, path=path)
        exiting = self.config.on_preempt == "exit"
        if session is not None and self.config.verbose:
            then = f"exiting with status {exit_code(signum)}" if exiting else "training continues"
            print(f"autockpt: {name} received; checkpoint of step {step} committed ({path}); {then}", flush=True)
        if exiting:
            self._stop_preemption()
            raise Preempted(signum, step)
        if self._preemption is not None:
            self._preemption.clear()

    def _stop_preemption(self) -> None:
        if self._preemption is not None:
            self._preemption.uninstall()
        if self._hidden_lightning_warning is not None:
            with contextlib.suppress(ValueError):
                warnings.filters.remove(self._hidden_lightning_warning)  # type: ignore[attr-defined]
                getattr(warnings, "_filters_mutated", lambda: None)()
            self._hidden_lightning_warning = None

    def _save(self, trainer: pl.Trainer, step: int, reason: str) -> None:
        connector = trainer._checkpoint_connector
        session = self._session
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
            # The manifest's CRC-32 covers the whole file: skip torch's second, per-record one.
            return Snapshot(
                write=lambda f: save_tree(tree, f, zip_crc32=False),
                nbytes=copied_bytes,
                pending=pending,
                mode=snapshotter.mode,
            )

        stall = session.save(step, trainer.current_epoch, snapshot, reason=reason)
        interval = session.last_decision.interval if session.last_decision is not None else None
        self.events.append(
            CheckpointEvent(
                step=step,
                epoch=trainer.current_epoch,
                reason=reason,
                interval_steps=interval.steps if interval is not None else None,
                interval_rule=interval.rule if interval is not None else None,
                stall_s=stall,
                nbytes=copied_bytes,
            )
        )
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


