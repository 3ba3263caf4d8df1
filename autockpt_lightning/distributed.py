"""The Lightning strategy and cluster around the callback: which strategies are supported, the
one all-reduce per step that keeps the ranks in agreement, and the SLURM requeue check.

Call order (training thread, every rank): ``check_strategy`` in ``setup("fit")``;
``warn_if_slurm_requeue`` in ``on_train_start``; ``agree`` after every optimizer step when
``world_size > 1`` (all ranks call it together: it is a collective).
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from autockpt_core import AutockptError, ResumeNotExactWarning


def check_strategy(trainer: pl.Trainer) -> None:
    """Refuse strategies the callback cannot serve, naming the fix.

    The resume route in ``on_fit_start`` needs modules restored before ``on_fit_start``, and
    sharded strategies write through their own (sharded) save path.
    """
    strategy = trainer.strategy
    if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)) or strategy.restore_checkpoint_after_setup:
        raise AutockptError(
            f"AutoCheckpoint supports single-device and DDP training, not {type(strategy).__name__}. "
            "Fix: use strategy='ddp' (or a single device), or checkpoint sharded models with ModelCheckpoint."
        )


def agree(trainer: pl.Trainer, save: bool, signum: int | None) -> tuple[bool, int | None]:
    """One all-reduce: save if rank 0 decided so; preempt if any rank received a signal."""
    values = torch.tensor([int(save), signum or 0], device=trainer.strategy.root_device)
    agreed = trainer.strategy.reduce(values, reduce_op="max")
    return bool(agreed[0].item()), (int(agreed[1].item()) or None)


def warn_if_slurm_requeue(trainer: pl.Trainer) -> None:
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
