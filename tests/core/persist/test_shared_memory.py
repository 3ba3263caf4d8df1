"""Shared snapshot buffers (memfd segments) and the pool's background prefault."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from autockpt_core.persist.buffers import BufferPool
from autockpt_core.persist.shared_memory import (
    SharedArena,
    SharedRef,
    numpy_shared_pool,
    numpy_view,
    rebuild_tree,
    share_tree,
    shared_memory_supported,
)

needs_shm = pytest.mark.skipif(not shared_memory_supported(), reason="needs os.memfd_create (Linux)")


@needs_shm
def test_shared_arrays_are_views_of_one_segment_each_and_share_tree_round_trips() -> None:
    arena = SharedArena()
    pool = numpy_shared_pool(arena)
    pool.begin_round()
    a = pool.get("a", (3, 4), np.float32)
    b = pool.get("b", (5,), np.int64)
    empty = pool.get("e", (0,), np.float32)
    pool.end_round()
    a[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
    b[...] = 7
    tree = {"x": [a, {"y": b}], "n": 3, "e": empty}
    skeleton = share_tree(tree, arena)
    assert isinstance(skeleton["x"][0], SharedRef) and isinstance(skeleton["x"][1]["y"], SharedRef)
    assert skeleton["n"] == 3 and skeleton["e"] is empty  # not a segment: sent by value
    memories = {sid: arena._segments[sid].memory for sid in arena.live_segments()}
    rebuilt = rebuild_tree(skeleton, lambda ref: numpy_view(memories[ref.segment], ref.dtype, ref.shape))
    np.testing.assert_array_equal(rebuilt["x"][0], a)
    np.testing.assert_array_equal(rebuilt["x"][1]["y"], b)
    a[0, 0] = 99.0  # the same memory, not a copy
    assert rebuilt["x"][0][0, 0] == 99.0
    assert len(arena.pending_fds()) == 2 and arena.pending_fds() == []


@needs_shm
def test_dropping_a_buffer_closes_its_segment() -> None:
    arena = SharedArena()
    pool = numpy_shared_pool(arena)
    pool.begin_round()
    pool.get("a", (10,), np.float32)
    pool.end_round()
    assert len(arena.live_segments()) == 1
    pool.begin_round()
    pool.get("a", (20,), np.float32)  # new shape: a new segment replaces the old one
    pool.end_round()
    assert len(arena.live_segments()) == 1
    pool.begin_round()
    pool.end_round()  # the key was not used: released
    assert arena.live_segments() == [] and pool.total_bytes == 0


def test_prefault_allocates_and_touches_in_a_helper_thread_and_the_next_round_uses_it() -> None:
    threads: list[str] = []
    touched: list[tuple[int, ...]] = []

    def allocate(shape: tuple[int, ...], dtype: object) -> np.ndarray:
        threads.append(threading.current_thread().name)
        return np.empty(shape, dtype=dtype)

    pool: BufferPool[np.ndarray] = BufferPool(allocate=allocate, touch=lambda b: touched.append(b.shape))
    assert pool.prefault([("w", (4, 4), np.float32), ("b", (4,), np.float32)])
    pool.begin_round()
    w = pool.get("w", (4, 4), np.float32)
    pool.get("b", (4,), np.float32)
    pool.end_round()
    assert threads == ["autockpt-prefault", "autockpt-prefault"]  # nothing allocated by the snapshot
    assert touched == [(4, 4), (4,)]
    assert pool.prefaulted_bytes == pool.total_bytes == 80 and pool.allocations == 2
    assert not pool.prefault([("w", (4, 4), np.float32)])  # already there
    assert pool.prefault([("w", (8, 4), np.float32)])  # the shape changed
    pool.begin_round()
    assert pool.get("w", (8, 4), np.float32) is not w and threads[-1] == "autockpt-prefault"
    pool.end_round()


def test_a_failed_prefault_is_reported_and_the_snapshot_allocates_what_is_missing() -> None:
    calls = []

    def allocate(shape: tuple[int, ...], dtype: object) -> np.ndarray:
        calls.append(threading.current_thread().name)
        if threading.current_thread().name == "autockpt-prefault":
            raise MemoryError("no room")
        return np.empty(shape, dtype=dtype)

    pool: BufferPool[np.ndarray] = BufferPool(allocate=allocate)
    pool.prefault([("w", (4,), np.float32)])
    error = pool.settle()
    assert isinstance(error, MemoryError)
    pool.begin_round()
    assert pool.get("w", (4,), np.float32).shape == (4,)
    pool.end_round()
    assert calls == ["autockpt-prefault", threading.current_thread().name]
