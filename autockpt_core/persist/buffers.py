"""Reusable host buffers for snapshots: allocated once, reused every checkpoint.

Framework-neutral: the adapter injects ``allocate(shape, dtype)`` (numpy arrays by default,
pinned torch tensors on CUDA machines) and ``nbytes(buffer)``. A buffer is reallocated only
when the shape or dtype under its key changes; buffers whose keys were not used in a round
are released, so the pool tracks the current state size.

Threading: used from the training thread only. A buffer must not be overwritten while a
persist still reads it: the session waits for the in-flight persist before a new snapshot.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Hashable, TypeVar

import numpy as np

B = TypeVar("B")


def _numpy_allocate(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


def _numpy_nbytes(buffer: Any) -> int:
    return int(buffer.nbytes)


class BufferPool(Generic[B]):
    """Buffers keyed by a path in the state tree; see the module docstring for the contract."""

    def __init__(
        self,
        allocate: Callable[[tuple[int, ...], Any], B] = _numpy_allocate,  # type: ignore[assignment]
        nbytes: Callable[[B], int] = _numpy_nbytes,
    ) -> None:
        self._allocate = allocate
        self._nbytes = nbytes
        self._buffers: dict[Hashable, tuple[tuple[int, ...], Any, B]] = {}
        self._used: set[Hashable] = set()
        self._total = 0  # running sum of nbytes (total_bytes is read on every allocation)
        self.allocations = 0
        self.peak_bytes = 0

    def begin_round(self) -> None:
        """Start a snapshot: forget which keys were used."""
        self._used = set()

    def get(self, key: Hashable, shape: tuple[int, ...], dtype: Any) -> B:
        """The buffer for ``key``, reused when shape and dtype match, else freshly allocated."""
        shape = tuple(int(s) for s in shape)
        self._used.add(key)
        entry = self._buffers.get(key)
        if entry is not None and entry[0] == shape and entry[1] == dtype:
            return entry[2]
        buffer = self._allocate(shape, dtype)
        self.allocations += 1
        if entry is not None:
            self._total -= self._nbytes(entry[2])
        self._buffers[key] = (shape, dtype, buffer)
        self._total += self._nbytes(buffer)
        self.peak_bytes = max(self.peak_bytes, self.total_bytes)
        return buffer

    def end_round(self) -> None:
        """Finish a snapshot: release buffers whose keys were not used (the state shrank)."""
        for key in [k for k in self._buffers if k not in self._used]:
            self._total -= self._nbytes(self._buffers.pop(key)[2])

    @property
    def total_bytes(self) -> int:
        """Bytes currently held by the pool."""
        return self._total

    def __len__(self) -> int:
        return len(self._buffers)
