"""The processes of one ``fit()``, and the collectives that keep them in agreement.

A Keras job on the JAX backend may span several processes (``jax.distributed``, a
``keras.distribution.DataParallel`` over every process's devices). Only process 0 runs the
checkpoint session, decides and writes; every process must still do the same thing at each
step boundary. The rules are the core's
(:class:`~autockpt_core.policy.process_group.ProcessGroup`, shared with Lightning's ranks), and
the core's :class:`~autockpt_core.fit_driver.FitDriver` applies them:

- ``settle``/``agree``: once per step (and at an epoch's start and at the end of training):
  process 0's decision, any process's signal or failure, the slowest process's step times;
- ``raise_if_any_failed``: after a step that can fail on one process only, every process
  raises, so none is left waiting in a collective (or in the next training step's all-reduce)
  for one that stopped.

:class:`Processes` adds :meth:`~Processes.gather_text` (process 0's resume record at the
start, each process's generator states at a checkpoint) and builds both collectives on one
all-gather. In one process (every TensorFlow and torch job, and JAX without
``jax.distributed``) everything is local and costs nothing. Across JAX processes the gather is
``jax.experimental.multihost_utils.process_allgather`` (a jitted all-gather over every
process's devices), carrying raw bytes as ``uint8`` so float64 numbers and text arrive exactly
whether or not ``jax_enable_x64`` is set.

Call order and threading: the training thread, inside ``fit()``'s hooks; every process calls
each collective at the same point, in the same order.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from autockpt_core.policy.agreement import combine
from autockpt_core.policy.process_group import PeerFailedError, ProcessGroup

__all__ = ["JaxProcesses", "PeerFailedError", "Processes", "processes_for"]


class Processes(ProcessGroup):
    """The core's :class:`~autockpt_core.policy.process_group.ProcessGroup` plus
    :meth:`gather_text`; as it is, a one-process job (every collective local)."""

    def gather_bytes(self, data: bytes) -> list[bytes]:
        """Every process's ``data``, in process order (a collective)."""
        return [data]

    def gather_text(self, text: str) -> list[str]:
        """Every process's ``text``, in process order (a collective)."""
        return [part.decode("utf-8") for part in self.gather_bytes(text.encode("utf-8"))]

    def max_over_processes(self, numbers: Sequence[float]) -> list[float]:
        raw = self.gather_bytes(np.array(numbers, dtype=np.float64).tobytes())
        return combine([np.frombuffer(row, dtype=np.float64).tolist() for row in raw])

    def text_from(self, source: int, text: str) -> str:
        return self.gather_text(text)[source]


class JaxProcesses(Processes):
    """The processes of a ``jax.distributed`` job: :meth:`gather_bytes` is two
    ``process_allgather`` calls (the lengths, then the bytes padded to the longest); the
    per-step agreement, whose size every process knows, one."""

    def __init__(self, jax: Any) -> None:
        from jax.experimental import multihost_utils

        self._allgather = multihost_utils.process_allgather
        self.index = int(jax.process_index())
        self.count = int(jax.process_count())

    def gather_bytes(self, data: bytes) -> list[bytes]:
        sizes = self._gathered(np.array([len(data)], dtype=np.int32).view(np.uint8))
        lengths = [int(row.view(np.int32)[0]) for row in sizes]
        if not max(lengths):
            return [b""] * self.count
        # Every process sends the same shape, rounded up to a power of two so the jitted
        # all-gather is compiled for a few sizes, not for every length a text happens to have.
        padded = np.zeros(1 << max(8, (max(lengths) - 1).bit_length()), dtype=np.uint8)
        padded[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        return [bytes(row[:n]) for row, n in zip(self._gathered(padded), lengths)]

    def max_over_processes(self, numbers: Sequence[float]) -> list[float]:
        # One all-gather (the per-step agreement): every process sends the same number of bytes
        rows = self._gathered(np.array(numbers, dtype=np.float64).view(np.uint8))
        return combine([row.view(np.float64).tolist() for row in rows])

    def _gathered(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(self._allgather(array)).reshape(self.count, *array.shape)


def processes_for(backend: str) -> Processes:
    """The processes of this ``fit()``: a :class:`JaxProcesses` on JAX under ``jax.distributed``
    with more than one process, else the one-process :class:`Processes`."""
    jax = sys.modules.get("jax") if backend == "jax" else None
    if jax is not None and int(jax.process_count()) > 1:
        return JaxProcesses(jax)
    return Processes()
