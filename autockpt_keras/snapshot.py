"""Phase 1 for Keras: copy every variable into the session's reusable buffers and describe the
checkpoint (file header, manifest entry). The copy is the only time training is blocked.

Call order (training thread): :func:`buffer_layout` handed to the pool's prefault once, at
the first trained step (profiler warm-up); at each checkpoint the callback passes a
:class:`StateSnapshot` to ``session.save``, which runs it between ``pool.begin_round()`` and ``end_round()``; the
returned :class:`~autockpt_core.Snapshot` is written later by the session's writer thread,
reading the buffers only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from autockpt_core import BufferPool, Snapshot

from .checkpoint_file import file_metadata, make_snapshot
from .copying import Copier, settle_copier
from .resume_point import ResumePoint
from .state import StateEntry, collect_state


class StateSnapshot:
    """The snapshot callable for ``session.save``: copies the state and ``point`` (captured by
    the caller now) into a safetensors snapshot. ``process_points``: with several processes,
    each one's point as JSON (its generators), in process order. ``nbytes``: the bytes it
    copied (0 until called)."""

    def __init__(
        self,
        model: Any,
        copier: Copier,
        backend: str,
        point: ResumePoint,
        *,
        step: int,
        epoch: int,
        batch: int | None,
        process_points: list[str] | None = None,
    ) -> None:
        self.model = model
        self.copier = copier
        self.backend = backend
        self.point = point
        self.step = step
        self.epoch = epoch
        self.batch = batch
        self.process_points = process_points  # every process's point (JSON), jax.distributed
        self.nbytes = 0

    def __call__(self, pool: BufferPool[Any]) -> Snapshot:
        setup = settle_copier(self.copier)  # the read's trace, once: not a per-checkpoint cost
        arrays = self.copier(collect_state(self.model), pool)
        meta = file_metadata(
            step=self.step,
            epoch=self.epoch,
            batch=self.batch,
            next_epoch=self.point.epoch,
            backend=self.backend,
            keras_version=keras.__version__,
            keys=list(arrays),
            resume=self.point,
            process_points=self.process_points,
        )
        snap = make_snapshot(arrays, meta)  # this module's name: tests/fault/keras_script.py wraps it
        snap.mode = "sync"
        snap.setup_s = setup
        snap.hidden_s = float(getattr(self.copier, "hidden_s", 0.0))  # torch on CUDA: the queue's drain
        self.nbytes = snap.nbytes
        return snap


def manifest_meta(backend: str, point: ResumePoint, *, batch: int | None, steps_per_epoch: int | None) -> dict[str, Any]:
    """What the manifest records next to the file, for ``autockpt inspect`` and resume."""
    return {
        "backend": backend,
        "keras_version": keras.__version__,
        "batch": batch,
        "next_epoch": point.epoch,
        "batches_done": point.batches_done,
        "steps_per_epoch": steps_per_epoch,
    }


def buffer_layout(entries: Sequence[StateEntry]) -> list[tuple[str, tuple[int, ...], np.dtype[Any]]]:
    """``(key, shape, dtype)`` of the variables in ``entries`` (``collect_state``), for
    ``BufferPool.prefault``.

    Handed to the pool at the first trained step, so its helper thread allocates and faults in
    the reusable buffers while training goes on: neither a restart's first step nor the first
    (profiling) checkpoint pays the page faults. Variables whose dtype numpy does not name get
    their buffers at the first checkpoint: this only saves time, it never stops training.
    """
    layout = []
    for entry in entries:
        try:
            dtype = np.dtype(keras.backend.standardize_dtype(entry.variable.dtype))
        except (AttributeError, TypeError, ValueError):
            continue
        layout.append((entry.key, entry.shape, dtype))
    return layout
