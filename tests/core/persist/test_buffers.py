import numpy as np

from autockpt_core import BufferPool


def test_reuses_buffers_and_never_grows_over_many_rounds() -> None:
    pool = BufferPool()
    state = {"a": np.ones((64, 64), np.float32), "b": np.arange(10, dtype=np.int64)}
    first: dict[str, np.ndarray] = {}
    for round_ in range(1000):
        pool.begin_round()
        for key, value in state.items():
            buf = pool.get(key, value.shape, value.dtype)
            np.copyto(buf, value)
            if round_ == 0:
                first[key] = buf
            else:
                assert buf is first[key]
        pool.end_round()
    assert pool.allocations == 2
    assert pool.total_bytes == sum(v.nbytes for v in state.values())
    assert pool.peak_bytes == pool.total_bytes


def test_reallocates_on_shape_or_dtype_change_and_releases_unused() -> None:
    pool = BufferPool()
    pool.begin_round()
    a = pool.get("a", (4,), np.float32)
    pool.get("gone", (1000,), np.float64)
    pool.end_round()
    pool.begin_round()
    assert pool.get("a", (4,), np.float64) is not a
    assert pool.get("a", (4,), np.float64).dtype == np.float64
    pool.end_round()
    assert len(pool) == 1
    assert pool.total_bytes == 32
    assert pool.allocations == 3


def test_custom_allocator() -> None:
    calls = []

    def allocate(shape, dtype):
        calls.append((shape, dtype))
        return bytearray(int(np.prod(shape)) * np.dtype(dtype).itemsize)

    pool = BufferPool(allocate, nbytes=len)
    pool.begin_round()
    pool.get("x", (3, 2), np.float32)
    pool.end_round()
    assert calls == [((3, 2), np.float32)]
    assert pool.total_bytes == 24


def test_size_bookkeeping_is_linear_in_the_number_of_buffers() -> None:
    calls = 0

    def nbytes(buffer: np.ndarray) -> int:
        nonlocal calls
        calls += 1
        return int(buffer.nbytes)

    pool: BufferPool[np.ndarray] = BufferPool(nbytes=nbytes)
    pool.begin_round()
    for i in range(2000):
        pool.get(i, (2,), np.float32)
    pool.end_round()
    assert pool.total_bytes == 2000 * 8 == pool.peak_bytes
    assert calls <= 2000  # not once per buffer per allocation (quadratic)
