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
import dataclasses
import inspect
import logging
import os
import signal
import warnings
from pathlib import Path
from typing import Any, Mapping

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from autockpt_core import (
    AutockptError,
    BufferPool,
    CheckpointSession,
    Config,
    Decision,
    Preempted,
    PreemptionHandler,
    ResumeNotExactWarning,
    Snapshot,
    Storage,
    find_latest_valid,
    storage_for,
)
from autockpt_core.config import CONFIG_DEFAULTS, config_from_keywords
from autockpt_core.preemption import exit_code
from autockpt_torch import TorchSnapshotter, save_tree, torch_buffer_pool
from autockpt_torch.staging import optimizer_owned

from . import resume as _resume

__all__ = ["AutoCheckpoint", "CheckpointEvent", "PreemptionRecord", "latest_checkpoint"]

log = logging.getLogger("autockpt")

FRAMEWORK = "lightning"
SUFFIX = ".ckpt"

# Config's defaults, so the signature below shows (and jsonargparse sees) the real values
# without restating them here.
_DEFAULTS = CONFIG_DEFAULTS


@dataclasses.dataclass(frozen=True)
class CheckpointEvent:
    """One checkpoint this callback took: what the policy said and what it cost.

    ``stall_s`` is the time ``session.save`` blocked the training thread (dump_checkpoint and
    the copy, plus any wait for the previous persist); ``nbytes`` is the tensor payload copied.
    """

    step: int
    epoch: int
    reason: str
    interval_steps: int | None
    interval_rule: str | None
    stall_s: float
    nbytes: int


@dataclasses.dataclass(frozen=True)
class PreemptionRecord:
    """The emergency checkpoint taken after a signal: its step, the signal and the file."""

    step: int
    signal: str
    path: str | None


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
        self._finished = False
        self._last_step: int | None = None
        self._logged_interval: int | None = None
        self.events: list[CheckpointEvent] = []
        self.resumed_from: int | None = None
        self.preempted: PreemptionRecord | None = None
        self._trainer: pl.Trainer | None = None
        self._restore_state: dict[str, Any] | None = None  # from load_state_dict, applied in on_train_start
        self._rng_for_save: dict[int, dict[str, Any]] | None = None
        self._preemption: PreemptionHandler | None = None
        self._warned_loaders = False
        self._deferred_from: int | None = None  # a checkpoint due at an unclean boundary ...
        self._deferred_reason: str | None = None  # ... is taken at the next step
        self._hidden_lightning_warning: tuple[Any, ...] | None = None

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
        if stage != "fit":
            return
        strategy = trainer.strategy
        # The resume route in on_fit_start needs modules restored before on_fit_start, and
        # sharded strategies write through their own (sharded) save path.
        if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)) or strategy.restore_checkpoint_after_setup:
            raise AutockptError(
                f"AutoCheckpoint supports single-device and DDP training, not {type(strategy).__name__}. "
                "Fix: use strategy='ddp' (or a single device), or checkpoint sharded models with ModelCheckpoint."
            )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._session = self._new_session() if trainer.is_global_zero else None
        self._finished = False
        self._last_step = None
        self._logged_interval = None
        self.events = []
        self.resumed_from = None
        self.preempted = None
        self._trainer = trainer
        self._deferred_from = self._deferred_reason = None
        if self.config.resume:
            self._auto_resume(trainer)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_exact_state(trainer)  # samplers, then RNG: nothing may draw after it
        self._last_step = trainer.global_step
        if self._session is not None:
            self._session.start(trainer.global_step)
        # After Lightning's own handlers (registered before the train loop), so ours chain to them.
        self._preemption = PreemptionHandler(self.config.signals) if self.config.signals else None
        if self._preemption is not None:
            self._preemption.install()
            _warn_if_slurm_requeue(trainer)

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
            save, signum = _agree(trainer, save, signum)
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

    def _auto_resume(self, trainer: pl.Trainer) -> None:
        # Auto-resume route (lightning 2.6). Trainer._run restores modules and callbacks from
        # fit()'s ckpt_path before on_fit_start and loops/optimizers right after it, both from
        # the connector's preloaded `_loaded_checkpoint`. Restoring modules and callbacks here
        # with `_restore_modules_and_callbacks(path)` therefore makes Lightning's own
        # restore_training_state() restore loops, optimizers, schedulers and precision state,
        # and resume_end() report "Restored all states from ... <our file>". A non-empty
        # `_loaded_checkpoint` at this point means the user gave a ckpt_path (argument or
        # trainer.ckpt_path): it wins and nothing is loaded here. Rejected alternatives:
        # setting trainer.ckpt_path in setup() is too late (_run already holds its own
        # ckpt_path); the OnExceptionCheckpoint route makes _parse_ckpt_path print a
        # misleading "ckpt_path=None ... last model of the previous fit" warning on every run
        # and picks by mtime among ModelCheckpoint's last*.ckpt files too.
        # A trainer that already trained in this process (a second fit() call) continues from
        # its in-memory state, which is at least as new as any checkpoint: nothing to load.
        connector = trainer._checkpoint_connector
        if connector._loaded_checkpoint or trainer.global_step > 0:
            return
        path: str | None = None
        session = self._session
        if session is not None:
            record = session.resume_record()
            if record is not None:
                path = _location(session.storage, record.name)
                self.resumed_from = record.step
                if self.config.verbose:
                    print(f"autockpt: resuming from step {record.step}: {path}", flush=True)
        if trainer.world_size > 1:
            path = trainer.strategy.broadcast(path, src=0)
        if path is None:
            return
        # Our own file, verified against the manifest's checksum: full unpickling is needed
        # for hparams such as argparse.Namespace, as with any Lightning .ckpt you trust.
        # (Lightning releases before `weights_only` existed always unpickled fully.)
        restore = connector._restore_modules_and_callbacks
        if "weights_only" in inspect.signature(restore).parameters:
            restore(path, weights_only=False)
        else:  # pragma: no cover - older Lightning
            restore(path)

    def _checkpoint(self, trainer: pl.Trainer, step: int, reason: str) -> None:
        """``_save`` with every rank's generator states gathered first (all ranks call this)."""
        self._rng_for_save = _resume.gather_rng(trainer)  # read by state_dict() inside dump_checkpoint
        try:
            self._save(trainer, step, reason)
        finally:
            self._rng_for_save = None

    def _restore_exact_state(self, trainer: pl.Trainer) -> None:
        """on_train_start: apply the restored sampler positions and RNG; warn where not exact."""
        state, self._restore_state = self._restore_state, None
        if not self._warned_loaders:
            self._warned_loaders = True
            problems = _resume.loader_problems(trainer)
            if problems and trainer.is_global_zero:
                warnings.warn(
                    "autockpt: a resumed run will not see exactly the data an uninterrupted run sees: "
                    + "; ".join(problems) + ".",
                    ResumeNotExactWarning,
                    stacklevel=2,
                )
        if not state:
            if self.resumed_from is not None and trainer.is_global_zero:
                warnings.warn(
                    f"autockpt: the checkpoint of step {self.resumed_from} holds no autockpt state "
                    "(random generators, sampler positions): it was written by an older autockpt, "
                    "so this resume is not bitwise exact.",
                    ResumeNotExactWarning,
                    stacklevel=2,
                )
            return
        if _resume.sampler_covers_plain_loaders(trainer):
            # Every plain train loader resumes through its ResumableSampler: Lightning's warning
            # that such a loader restarts the epoch does not apply (filter removed when training ends).
            warnings.filterwarnings("ignore", message=_resume.LIGHTNING_NOT_RESUMABLE_WARNING)
            self._hidden_lightning_warning = warnings.filters[0]
        problems = _resume.restore(trainer, state)
        if problems:
            warnings.warn(
                f"autockpt: resuming at step {trainer.global_step} is not bitwise exact: " + "; ".join(problems) + ".",
                ResumeNotExactWarning,
                stacklevel=2,
            )

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
            path = _location(session.storage, record.name) if record is not None else None
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


def _location(storage: Storage, name: str) -> str:
    """A path (local storage) or URL (fsspec storage) Lightning can load ``name`` from."""
    path = storage.local_path(name)
    return path if path is not None else f"{storage.location.rstrip('/')}/{name}"


def latest_checkpoint(dirpath: str | os.PathLike[str]) -> str | None:
    """Path of the newest Lightning checkpoint in ``dirpath`` whose file matches the manifest.

    Corrupt or torn newer files are skipped with a warning; None when there is none.
    """
    storage = storage_for(dirpath)
    record = find_latest_valid(storage, framework=FRAMEWORK)
    return None if record is None else _location(storage, record.name)


def _agree(trainer: pl.Trainer, save: bool, signum: int | None) -> tuple[bool, int | None]:
    """One all-reduce: save if rank 0 decided so; preempt if any rank received a signal."""
    values = torch.tensor([int(save), signum or 0], device=trainer.strategy.root_device)
    agreed = trainer.strategy.reduce(values, reduce_op="max")
    return bool(agreed[0].item()), (int(agreed[1].item()) or None)


def _warn_if_slurm_requeue(trainer: pl.Trainer) -> None:
    """Lightning's SLURM auto-requeue saves from inside its signal handler and resumes from that file."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    environment = trainer._accelerator_connector.cluster_environment
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue and trainer.is_global_zero:
        warnings.warn(
            "autockpt: Lightning's SLURM auto-requeue is on: on "
            f"{getattr(environment.requeue_signal, 'name', environment.requeue_signal)} it saves "
            "hpc_ckpt_*.ckpt from inside its signal handler (not at a step boundary), and the "
            "requeued job resumes from that file instead of autockpt's checkpoints, so the resume "
            "is not exact. Fix: Trainer(plugins=[SLURMEnvironment(auto_requeue=False)]) and requeue "
            "from the batch script (docs/reliability.md, 'SLURM').",
            ResumeNotExactWarning,
            stacklevel=3,
        )
