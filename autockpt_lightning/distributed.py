"""The Lightning strategy and cluster around the callback: which strategies are supported, the
one all-reduce per step that keeps the ranks in agreement, and the SLURM requeue check.

Call order (training thread, every rank): ``check_strategy`` in ``setup("fit")``;
``warn_if_slurm_requeue`` in ``on_fit_start``; a ``LightningRanks(trainer)`` goes to the core's
``FitDriver``, which calls ``settle`` after every optimizer step, ``settle``/``agree`` at the
start and end of training, and ``raise_if_any_failed`` after every step that can fail on one
rank only (a checkpoint, the end of training); auto-resume and sharded saves call
``raise_if_any_failed`` themselves. All are collectives: every rank calls them together.

The rules are the core's (``autockpt_core.policy.process_group``, which the Keras adapter's JAX
processes share): the per-step agreement's numbers (rank 0's decisions, any rank's signal and
failure, and each rank's step and checkpoint-blocked times, so rank 0's profiler sees the
slowest rank's and the interval suits the job rather than rank 0), and how a failure on one
rank is raised on all. This module supplies the collectives (:class:`LightningRanks`).
"""

from __future__ import annotations

import warnings
from typing import Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

from autockpt_core import AutockptError, ResumeNotExactWarning
from autockpt_core.policy.agreement import Agreement
from autockpt_core.policy.process_group import AGREED, PeerFailedError, ProcessGroup

from . import internals

__all__ = [
    "AGREED",
    "Agreement",
    "LightningRanks",
    "PeerFailedError",
    "RankFailedError",
    "check_strategy",
    "raise_if_any_failed",
]

RankFailedError = PeerFailedError
"""A second public name of the core's :class:`PeerFailedError`, which every other rank raises
when one rank failed (Keras' processes raise the same class)."""


def check_strategy(trainer: pl.Trainer) -> None:
    """Refuse strategies the callback cannot serve, naming the fix.

    Single-device and DDP strategies are checkpointed by rank 0; ``ModelParallelStrategy``
    (FSDP2 ``fully_shard``, tensor parallelism) sharded, by every rank (``sharded.py``), which
    needs its ``save_distributed_checkpoint=True`` (the default). ``FSDPStrategy`` (FSDP1) is
    refused: its sharded state dict differs, and Lightning 2.6 runs it on GPUs only, where
    autockpt has not been tested with it. Other strategies (DeepSpeed, ...) are refused.
    """
    strategy = trainer.strategy
    name = type(strategy).__name__
    if isinstance(strategy, ModelParallelStrategy):
        if internals.saves_distributed_checkpoint(strategy) is False:  # None: unknown (warned at setup)
            raise AutockptError(
                f"AutoCheckpoint writes {name}'s checkpoints sharded (every rank its own shards), "
                "but this strategy has save_distributed_checkpoint=False, which gathers the whole model "
                f"on rank 0. Fix: {name}(save_distributed_checkpoint=True) (the default)."
            )
        return
    if isinstance(strategy, FSDPStrategy):
        raise AutockptError(
            f"AutoCheckpoint does not support {name} (FSDP1). Fix: shard the model with FSDP2's "
            "fully_shard in configure_model under strategy=ModelParallelStrategy(), whose checkpoints "
            "AutoCheckpoint writes sharded (docs/distributed.md), or checkpoint with ModelCheckpoint."
        )
    if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)) or strategy.restore_checkpoint_after_setup:
        raise AutockptError(
            f"AutoCheckpoint supports single-device, DDP and ModelParallelStrategy training, not {name}. "
            "Fix: use strategy='ddp' (or a single device), ModelParallelStrategy for sharded models, "
            "or checkpoint with ModelCheckpoint."
        )


class LightningRanks(ProcessGroup):
    """A fit's ranks as a core :class:`~autockpt_core.policy.process_group.ProcessGroup`: its
    maximum is one ``torch.distributed`` all-reduce, its message the strategy's broadcast."""

    member = "rank"

    def __init__(self, trainer: pl.Trainer) -> None:
        self.trainer = trainer
        self.index = trainer.global_rank
        self.count = trainer.world_size

    def max_over_processes(self, numbers: Sequence[float]) -> list[float]:
        values = torch.tensor(list(numbers), dtype=torch.float64, device=self.trainer.strategy.root_device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # One collective: the strategy's reduce() puts a barrier before its all-reduce (two
            # round trips; measured +88% on 4 ms CPU steps, docs/benchmarks.md).
            torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)
            return list(values.tolist())
        return list(self.trainer.strategy.reduce(values, reduce_op="max").tolist())

    def text_from(self, source: int, text: str) -> str:
        return str(self.trainer.strategy.broadcast(text, src=source))


def raise_if_any_failed(trainer: pl.Trainer, error: BaseException | None) -> None:
    """Collective: when any rank has an ``error``, every rank raises (world size 1: re-raise it).

    The failing rank re-raises its own exception; the others raise a :class:`PeerFailedError`
    with the same message, so no rank is left waiting in a collective for one that stopped.
    """
    LightningRanks(trainer).raise_if_any_failed(error)


def warn_if_slurm_requeue(trainer: pl.Trainer) -> None:
    """Lightning's SLURM auto-requeue saves from inside its signal handler and resumes from that file."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    environment = internals.cluster_environment(trainer)
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
