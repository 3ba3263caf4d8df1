"""Collectives between threads, for unit tests of code that runs on every process of a job.

:class:`ThreadGather` is an all-gather for ``count`` threads (each calls it with its own value,
all get every value in index order); :func:`on_threads` runs one function per index at once
and returns what each returned or raised; :class:`ThreadGroup` is a core ``ProcessGroup`` whose
collectives run over a :class:`ThreadGather`.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from autockpt_core.policy.process_group import ProcessGroup


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


class ThreadGroup(ProcessGroup):
    """Process ``index`` of ``gather.count``, its collectives over :class:`ThreadGather`."""

    def __init__(self, index: int, gather: ThreadGather) -> None:
        self.index, self.count, self.gather = index, gather.count, gather

    def max_over_processes(self, numbers: Sequence[float]) -> list[float]:
        return [max(column) for column in zip(*self.gather(self.index, list(numbers)))]

    def text_from(self, source: int, text: str) -> str:
        return str(self.gather(self.index, text)[source])
