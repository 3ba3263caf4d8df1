"""Collectives between threads, for unit tests of code that runs on every process of a job.

:class:`ThreadGather` is an all-gather for ``count`` threads (each calls it with its own value,
all get every value in index order); :func:`on_threads` runs one function per index at once
and returns what each returned or raised.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable


class ThreadGather:
    """An all-gather over ``count`` threads (each call is one round; every thread must join)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._barrier = threading.Barrier(count, timeout=10)
        self._slots: list[Any] = [None] * count

    def __call__(self, index: int, value: Any) -> list[Any]:
        self._slots[index] = value
        self._barrier.wait()  # every value is in
        out = list(self._slots)
        self._barrier.wait()  # every thread has read them before the next round writes
        return out


def on_threads(count: int, fn: Callable[[int], Any]) -> list[Any]:
    """``fn(i)`` for every ``i`` in ``range(count)`` at once: each result, or the exception it raised."""

    def call(i: int) -> Any:
        try:
            return fn(i)
        except BaseException as exc:  # returned for the test to inspect
            return exc

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(call, range(count)))
