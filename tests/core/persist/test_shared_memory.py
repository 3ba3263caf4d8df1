"""Shared snapshot buffers (memfd segments) and the pool's background prefault."""

from __future__ import annotations

import errno
import gc
import logging
import os
import threading

import numpy as np
import pytest

from autockpt_core.persist.buffers import BufferPool
from autockpt_core.persist.shared_memory import (
    ALIGNMENT,
    SharedArena,
    SharedRef,
    numpy_shared_pool,
    numpy_view,
    rebuild_tree,
    share_arrays,
    shared_memory_supported,
)

needs_shm = pytest.mark.skipif(not shared_memory_supported(), reason="needs os.memfd_create (Linux)")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@needs_shm
def test_shared_arrays_are_ranges_of_one_segment_and_share_arrays_round_trips() -> None:
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
    skeleton = share_arrays(tree, arena)
    assert isinstance(skeleton["x"][0], SharedRef) and isinstance(skeleton["x"][1]["y"], SharedRef)
    assert skeleton["x"][0].segment == skeleton["x"][1]["y"].segment  # one segment, two ranges
    assert skeleton["x"][1]["y"].offset % ALIGNMENT == 0 and skeleton["x"][1]["y"].offset > 0
    assert skeleton["n"] == 3 and skeleton["e"] is empty  # not in a segment: sent by value
    memories = {sid: arena._segments[sid].memory for sid in arena.live_segments()}
    rebuilt = rebuild_tree(skeleton, lambda ref: numpy_view(memories[ref.segment], ref.offset, ref.dtype, ref.shape))
    np.testing.assert_array_equal(rebuilt["x"][0], a)
    np.testing.assert_array_equal(rebuilt["x"][1]["y"], b)
    a[0, 0] = 99.0  # the same memory, not a copy
    assert rebuilt["x"][0][0, 0] == 99.0
    assert len(arena.pending_fds()) == 1 and arena.pending_fds() == []
    assert arena.locate(b.ctypes.data, b.nbytes) == (skeleton["x"][1]["y"].segment, skeleton["x"][1]["y"].offset)
    assert arena.locate(np.zeros(4).ctypes.data, 32) is None


@needs_shm
@pytest.mark.parametrize("tensors", [1000, 5000])
def test_the_open_descriptors_do_not_grow_with_the_number_of_buffers(tensors: int) -> None:
    gc.collect()  # descriptors of earlier tests' garbage would close inside this test's count
    before = _open_fds()
    arena = SharedArena(segment_bytes=1 << 20)  # small segments: many of them if growth were linear
    pool = numpy_shared_pool(arena)
    pool.begin_round()
    arrays = [pool.get(i, (1000,), np.float32) for i in range(tensors)]  # 4 MB .. 20 MB in all
    pool.end_round()
    for i, array in enumerate(arrays):
        array[...] = i
    assert _open_fds() - before <= 2 * arena.segment_count <= 12  # the descriptor and the mapping's own copy
    assert arena.total_bytes == tensors * 4000
    assert all(int(a[0]) == i and int(a[-1]) == i for i, a in enumerate(arrays))  # no two overlap
    arena.close()
    del arrays, pool, array
    gc.collect()
    assert _open_fds() == before  # the mappings went with the last views


@needs_shm
def test_released_ranges_are_reused_and_merged_and_an_empty_segment_is_closed() -> None:
    arena = SharedArena(segment_bytes=1 << 16)
    pool = numpy_shared_pool(arena)
    pool.begin_round()
    for key in "abcd":
        pool.get(key, (1024,), np.uint8)
    pool.end_round()
    offsets = {key: arena.ref_of(pool.get(key, (1024,), np.uint8)).offset for key in "abcd"}  # type: ignore[union-attr]
    assert offsets == {"a": 0, "b": 1024, "c": 2048, "d": 3072} and arena.segment_count == 1
    pool.begin_round()
    pool.get("a", (1024,), np.uint8)
    pool.get("d", (1024,), np.uint8)
    pool.end_round()  # b and c released: one free range of 2048 bytes between a and d
    pool.begin_round()
    for key in "ad":
        pool.get(key, (1024,), np.uint8)
    merged = pool.get("e", (2048,), np.uint8)
    pool.end_round()
    assert arena.ref_of(merged).offset == 1024 and arena.segment_count == 1  # type: ignore[union-attr]
    pool.begin_round()
    pool.end_round()  # everything released
    assert arena.segment_count == 0 and arena.live_segments() == [] and pool.total_bytes == 0


@needs_shm
def test_a_buffer_larger_than_a_segment_gets_its_own_and_segments_grow_geometrically() -> None:
    arena = SharedArena(segment_bytes=1 << 16)
    for _ in range(64):  # 4 MiB in 64 KiB buffers
        arena.allocate(1 << 16)
    sizes = [seg.size for seg in arena._segments.values()]
    assert sizes == [1 << 16, 1 << 16, 1 << 17, 1 << 18, 1 << 19, 1 << 20, 1 << 21]  # each one the size of all before
    big, offset, _memory = arena.allocate(10 << 20)
    assert offset == 0 and arena._segments[big].size >= 10 << 20
    arena.close()


@needs_shm
def test_without_segments_the_pool_falls_back_to_ordinary_memory_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    arena = SharedArena()
    pool = numpy_shared_pool(arena)

    def no_fds(*_args: object) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(os, "memfd_create", no_fds)
    with caplog.at_level(logging.WARNING, logger="autockpt"):
        pool.begin_round()
        a = pool.get("a", (10,), np.float32)
        b = pool.get("b", (10,), np.float32)
        pool.end_round()
    assert a.shape == b.shape == (10,) and arena.ref_of(a) is None and arena.segment_count == 0
    assert isinstance(arena.failure, OSError) and arena.failure.errno == errno.EMFILE
    warnings = [r.getMessage() for r in caplog.records if "no shared memory" in r.getMessage()]
    assert len(warnings) == 1 and "Too many open files" in warnings[0] and "writer thread" in warnings[0]


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
