"""The training thread's per-step record: preallocated slots, filled by the hot path, drained in batches.

:meth:`FitDriver.step_end <autockpt_core.fit_driver.FitDriver.step_end>` writes one slot per
optimizer step (its number, the clock when the step's hook was entered, which is when the step
ended, the clock when the hook returned, and the adapter's raw loss value) and goes on; every
statistic (window medians, the decision, the overhead meter, the loss curve) is computed from
the slots when the driver drains them: at a step where a checkpoint may be due, when the ring
is full, or after :data:`FLUSH_S` seconds. Nothing here reads a clock or converts a value.

Threading: training thread only.
"""

from __future__ import annotations

import math
from typing import Any, Callable

__all__ = ["FLUSH_S", "RING_STEPS", "Drained", "StepRing"]

#: Steps the ring holds: the statistics are at most this many steps old when the policy decides.
RING_STEPS = 32
#: The longest time between two drains (the time rules ``min_interval``/``max_interval`` and a
#: slow step's estimates are seen this late at most).
FLUSH_S = 1.0


class Drained:
    """What one drain returned: the steps, their end times and hook-exit times, oldest first;
    ``losses``: the adapter's raw values (tensors, floats or None), converted only on request."""

    __slots__ = ("steps", "ends", "exits", "losses")

    def __init__(self, steps: list[int], ends: list[float], exits: list[float], losses: list[Any]) -> None:
        self.steps, self.ends, self.exits, self.losses = steps, ends, exits, losses

    def __len__(self) -> int:
        return len(self.steps)

    def hook_seconds(self) -> float:
        """The hot path's own time in these steps (a step that left it has its exit at its end)."""
        return sum(self.exits) - sum(self.ends)

    def float_losses(self, to_float: Callable[[Any], float | None]) -> list[float | None]:
        """Every step's loss as a float (``to_float`` may read a device value: it may wait)."""
        return [None if loss is None else to_float(loss) for loss in self.losses]


class StepRing:
    """``capacity`` slots; the driver writes ``steps``, ``ends``, ``losses`` and ``exits`` at
    index ``count`` and increments it; :meth:`drain` hands them over and empties the ring.
    ``check_step``/``check_time``: the driver's hot path ends at this step or time
    (:meth:`plan`); at first, at once."""

    __slots__ = ("steps", "ends", "exits", "losses", "count", "capacity", "check_step", "check_time")

    def __init__(self, capacity: int = RING_STEPS) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.steps: list[int] = [0] * capacity
        self.ends: list[float] = [0.0] * capacity
        self.exits: list[float] = [0.0] * capacity
        self.losses: list[Any] = [None] * capacity
        self.count = 0
        self.check_step = 0
        self.check_time = -math.inf

    def plan(self, step: int, now: float, next_step: int | None, next_time: float | None) -> None:
        """After a decision at ``step``: look again at ``next_step`` or ``next_time`` (None: at
        the next step; no time rule), at most a ring's capacity of steps and :data:`FLUSH_S` ahead."""
        nxt = step + 1 if next_step is None else max(step + 1, min(next_step, step + self.capacity))
        self.check_step = nxt
        later = now + FLUSH_S
        self.check_time = later if next_time is None else min(next_time, later)

    def drain(self) -> Drained:
        """The filled slots, oldest first; the ring is empty afterwards (its loss references dropped)."""
        n = self.count
        out = Drained(self.steps[:n], self.ends[:n], self.exits[:n], self.losses[:n])
        for i in range(n):
            self.losses[i] = None
        self.count = 0
        return out
