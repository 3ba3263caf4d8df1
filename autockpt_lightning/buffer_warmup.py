"""No cold start: the snapshot buffers are allocated and faulted in before the first checkpoint.

Without this the first checkpoint allocates its host buffers and pays their page faults on
the training thread (measured: 456 vs 159 ms at 1 GB, 3.8–6.2 s at 4 GB; docs/benchmarks.md).
After each optimizer step :class:`BufferWarmup` compares a cheap fingerprint of the state
(how many entries each optimizer's state holds: optimizers create it lazily, and unfreezing
layers adds to it) with the one it last saw; when it changed, it hands the session's
:class:`~autockpt_core.BufferPool` the layout of the tensors ``dump_checkpoint`` will hold
(the module's ``state_dict`` and every optimizer's ``state_dict``, under the same paths the
snapshot uses), and the pool allocates and touches the missing buffers in its prefault
thread while training goes on.

Threading: ``after_step`` on the training thread (``on_train_batch_end``, global rank 0).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from autockpt_core import BufferPool
from autockpt_core.persist.tree import iter_leaves


def checkpoint_layout(trainer: pl.Trainer) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """``(path, shape, dtype)`` of the dense tensors ``dump_checkpoint`` puts in a checkpoint.

    Paths are those of the snapshot tree (``state_dict/...``, ``optimizer_states/<i>/...``);
    tensors a callback or hook adds elsewhere get their buffers at the first checkpoint.
    """
    tree = {
        "state_dict": trainer.lightning_module.state_dict(),
        "optimizer_states": [optimizer.state_dict() for optimizer in trainer.optimizers],
    }
    return [
        (path, tuple(t.shape), t.dtype)
        for path, t in iter_leaves(tree, lambda v: isinstance(v, torch.Tensor))
        if t.layout == torch.strided and not t.is_quantized
    ]


def state_fingerprint(trainer: pl.Trainer) -> tuple[int, ...]:
    """Changes when the checkpoint's tensors do (optimizer state created or grown); O(optimizers)."""
    return tuple(len(getattr(optimizer, "state", ())) for optimizer in trainer.optimizers)


class BufferWarmup:
    """Prefaults the session's buffers at the first step and whenever the state grew."""

    def __init__(self) -> None:
        self._seen: tuple[int, ...] | None = None

    def after_step(self, trainer: pl.Trainer, buffers: BufferPool[Any]) -> None:
        if buffers.prefaulting:
            return  # look again after it finished
        fingerprint = state_fingerprint(trainer)
        if fingerprint == self._seen:
            return
        self._seen = fingerprint
        buffers.prefault(checkpoint_layout(trainer))
