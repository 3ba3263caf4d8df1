"""A sliding window of measurements kept sorted as well, for medians read after every step.

The profiler's estimates are medians over the last ``maxlen`` values, read once per training
step. Sorting the window for every reading costs tens of microseconds per step in the
training thread, a cost every step pays; a window that stays sorted as values arrive (one
``bisect`` insertion and one removal, memmoves in C) gives the median in O(1). The figures
derived from the values (median, median absolute deviation, mean and standard deviation) are
computed once per change and kept until the next one.

Every result equals the plain computation over the same values (``statistics.median``;
``stats.mean_sd``, whose ``math.fsum`` does not depend on the order).

Threading: none of its own; the profiler calls it under its lock.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import deque
from typing import Iterator

from .stats import mean_sd

__all__ = ["SortedWindow"]


class SortedWindow:
    """The newest ``maxlen`` values, in arrival order and sorted."""

    def __init__(self, maxlen: int) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen}")
        self._maxlen = maxlen
        self._order: deque[float] = deque(maxlen=maxlen)
        self._sorted: list[float] = []
        self._cache: dict[str, object] = {}

    def __len__(self) -> int:
        return len(self._order)

    def __bool__(self) -> bool:
        return bool(self._order)

    def __iter__(self) -> Iterator[float]:
        """The values in arrival order."""
        return iter(self._order)

    @property
    def last(self) -> float:
        """The newest value (IndexError when empty)."""
        return self._order[-1]

    def append(self, value: float) -> None:
        """Add ``value``; the oldest one leaves when the window is full."""
        order = self._order
        if len(order) == self._maxlen:
            self._remove_sorted(order[0])
        order.append(value)
        insort(self._sorted, value)
        if self._cache:
            self._cache.clear()

    def replace_last(self, value: float) -> None:
        """Put ``value`` in place of the newest value (IndexError when empty)."""
        self._remove_sorted(self._order[-1])
        self._order[-1] = value
        insort(self._sorted, value)
        self._cache.clear()

    def clear(self) -> None:
        self._order.clear()
        self._sorted.clear()
        self._cache.clear()

    def median(self) -> float | None:
        """The median (None when empty), as ``statistics.median`` gives it."""
        if "median" not in self._cache:
            self._cache["median"] = _median_of_sorted(self._sorted)
        return self._cache["median"]  # type: ignore[return-value]

    def median_abs_deviation(self) -> float | None:
        """The median of ``|v − median|`` over the values (None when empty)."""
        if "mad" not in self._cache:
            center = self.median()
            if center is None:
                self._cache["mad"] = None
            else:
                # Deviations from the center over sorted values fall, then rise: two runs,
                # which the sort merges in linear time.
                self._cache["mad"] = _median_of_sorted(sorted([abs(v - center) for v in self._sorted]))
        return self._cache["mad"]  # type: ignore[return-value]

    def capped_mean_sd(self, cap: float) -> tuple[float, float] | None:
        """``stats.mean_sd`` of the values, each capped at ``cap`` (None when empty)."""
        if not self._sorted:
            return None
        if self._sorted[-1] <= cap:  # no value reaches the cap: the plain figures, kept
            if "mean_sd" not in self._cache:
                self._cache["mean_sd"] = mean_sd(self._sorted)
            return self._cache["mean_sd"]  # type: ignore[return-value]
        return mean_sd([min(v, cap) for v in self._sorted])

    def mean_sd_below(self, cap: float) -> tuple[float, float, int] | None:
        """``stats.mean_sd`` of the values ≤ ``cap``, and how many (None when there is none)."""
        kept = self._sorted[: bisect_right(self._sorted, cap)]
        if not kept:
            return None
        if len(kept) == len(self._sorted):
            mean, sd = self.capped_mean_sd(cap)  # type: ignore[misc]  # the kept plain figures
            return mean, sd, len(kept)
        return (*mean_sd(kept), len(kept))

    def _remove_sorted(self, value: float) -> None:
        del self._sorted[bisect_left(self._sorted, value)]


def _median_of_sorted(values: list[float]) -> float | None:
    n = len(values)
    if n == 0:
        return None
    mid = n // 2
    if n % 2:
        return values[mid]
    return (values[mid - 1] + values[mid]) / 2
