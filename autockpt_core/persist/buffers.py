"""Reusable host buffers for snapshots: allocated once, reused every checkpoint.

Framework-neutral: the adapter injects ``allocate(shape, dtype)`` (numpy arrays by default,
pinned torch tensors on CUDA machines, shared-memory segments for the persist process),
``nbytes(buffer)``, optionally ``release(buffer)`` (called when the pool drops a buffer) and
``touch(buffer)`` (faults its pages in). A buffer is reallocated only when the shape or dtype
under its key changes; buffers whose keys were not used in a round are released, so the pool
tracks the current state size.

No cold start: :meth:`BufferPool.prefault` allocates and touches the buffers of a known
layout in a background thread (``autockpt-prefault``) while training goes on, so the first
checkpoint copies into warm memory like every later one instead of paying for allocation
and page faults (seconds at several GB).

Threading: ``get``/``begin_round``/``end_round`` run on the training thread; ``prefault``
starts the helper thread, whose buffers are taken over by the next ``begin_round`` (it
waits for the helper if it is still running) or ``settle``. A buffer must not be
overwritten while a persist still reads it: the session waits for the in-flight persist
before a new snapshot.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterable
from typing import Any, Callable, Generic, Hashable, TypeVar

import numpy as np

B = TypeVar("B")

Layout = Iterable[tuple[Hashable, tuple[int, ...], Any]]
"""``(key, shape, dtype)`` of each buffer a snapshot will need."""


def fault_in(address: int, nbytes: int) -> None:
    """Zero ``nbytes`` at ``address``, faulting every page in; ctypes releases the GIL, and no
    framework thread pool is used (a ``touch`` for :class:`BufferPool`)."""
    if nbytes:
        ctypes.memset(address, 0, nbytes)


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
        release: Callable[[B], None] | None = None,
        touch: Callable[[B], None] | None = None,
    ) -> None:
        self._allocate = allocate
        self._nbytes = nbytes
        self._release = release
        self._touch = touch
        self._buffers: dict[Hashable, tuple[tuple[int, ...], Any, B]] = {}
        self._used: set[Hashable] = set()
        self._total = 0  # running sum of nbytes (total_bytes is read on every allocation)
        self._prefault: threading.Thread | None = None
        self._prefaulted: dict[Hashable, tuple[tuple[int, ...], Any, B]] = {}
        self._prefault_error: BaseException | None = None
        self.allocations = 0
        self.peak_bytes = 0
        self.prefaulted_bytes = 0

    def prefault(self, layout: Layout) -> bool:
        """Allocate and touch the buffers of ``layout`` that the pool lacks, in a helper thread.

        Returns False (nothing started) when every buffer is already there or a prefault is
        still running. Buffers are taken over at the next :meth:`begin_round` or :meth:`settle`.
        """
        if self._prefault is not None:
            return False
        wanted = []
        for key, shape, dtype in layout:
            shape = tuple(int(s) for s in shape)
            entry = self._buffers.get(key)
            if entry is None or entry[0] != shape or entry[1] != dtype:
                wanted.append((key, shape, dtype))
        if not wanted:
            return False
        # not a daemon: interpreter exit joins it, so it is never inside torch's C++ code when
        # Python finalizes (a daemon thread there aborts the process: "terminate called
        # without an active exception", seen when a run ended two steps after a prefault began)
        self._prefault = threading.Thread(target=self._prefault_run, args=(wanted,), name="autockpt-prefault")
        self._prefault.start()
        return True

    def _prefault_run(self, wanted: list[tuple[Hashable, tuple[int, ...], Any]]) -> None:
        try:
            for key, shape, dtype in wanted:
                buffer = self._allocate(shape, dtype)
                if self._touch is not None:
                    self._touch(buffer)
                self._prefaulted[key] = (shape, dtype, buffer)
        except BaseException as exc:  # not fatal: the snapshot allocates what is missing
            self._prefault_error = exc

    @property
    def prefaulting(self) -> bool:
        return self._prefault is not None and self._prefault.is_alive()

    def settle(self) -> BaseException | None:
        """Wait for a running prefault and take its buffers over (training thread).

        Returns the error that stopped it, if any (the buffers it did not make are made by
        the next snapshot instead).
        """
        thread = self._prefault
        if thread is None:
            return None
        thread.join()
        self._prefault = None
        for key, entry in self._prefaulted.items():
            old = self._buffers.get(key)
            if old is not None:
                self._drop(old[2])
            self._buffers[key] = entry
            self._total += self._nbytes(entry[2])
            self.allocations += 1
            self.prefaulted_bytes += self._nbytes(entry[2])
        self._prefaulted = {}
        self.peak_bytes = max(self.peak_bytes, self._total)
        error, self._prefault_error = self._prefault_error, None
        return error

    def begin_round(self) -> None:
        """Start a snapshot: take over prefaulted buffers, forget which keys were used."""
        self.settle()
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
            self._drop(entry[2])
        self._buffers[key] = (shape, dtype, buffer)
        self._total += self._nbytes(buffer)
        self.peak_bytes = max(self.peak_bytes, self.total_bytes)
        return buffer

    def end_round(self) -> None:
        """Finish a snapshot: release buffers whose keys were not used (the state shrank)."""
        for key in [k for k in self._buffers if k not in self._used]:
            self._drop(self._buffers.pop(key)[2])

    def release_all(self) -> int:
        """Drop every buffer (training thread, no snapshot or persist using them); returns the
        bytes released. The next snapshot allocates again (the session's end: memory is not
        held while a finished callback lives on, e.g. in a notebook)."""
        self.settle()
        released = self._total
        for _shape, _dtype, buffer in self._buffers.values():
            self._drop(buffer)
        self._buffers, self._used, self._total = {}, set(), 0
        return released

    def _drop(self, buffer: B) -> None:
        self._total -= self._nbytes(buffer)
        if self._release is not None:
            self._release(buffer)

    @property
    def total_bytes(self) -> int:
        """Bytes currently held by the pool."""
        return self._total

    def __len__(self) -> int:
        return len(self._buffers)
