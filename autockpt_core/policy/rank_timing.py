"""One rank's step and checkpoint times, for combining the ranks of a data-parallel job.

Under data parallelism only rank 0 runs the checkpoint session, yet the job goes at the pace
of its slowest rank, and every rank is held up by a checkpoint (its collectives, rank 0's
copy). Each rank keeps a :class:`StepClock`; the adapter carries its :class:`RankTimes` in the
one per-step agreement (an all-reduce taking the maximum), and rank 0 hands the result to
:meth:`autockpt_core.CheckpointSession.combine_ranks`.

Call order (training thread, every rank): ``start`` when training starts; ``add_blocked`` for
each span the rank spent in a checkpoint (or waiting for rank 0's overlapped copy); ``lap`` at
every optimizer-step boundary, before the agreement. The clock is injected.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable


@dataclasses.dataclass(frozen=True)
class RankTimes:
    """What one step cost one rank (seconds); the maximum over ranks is the job's."""

    step_s: float  # the step, less the time this rank was blocked by checkpoints in it
    blocked_s: float  # the time this rank was blocked by the checkpoint before this step ended

    @classmethod
    def slowest(cls, times: "list[RankTimes]") -> "RankTimes":
        """The maximum of each figure over ranks (what the all-reduce computes)."""
        return cls(max(t.step_s for t in times), max(t.blocked_s for t in times))


class StepClock:
    """Times this rank's steps, net of its checkpoint blocking (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._last: float | None = None
        self._blocked = 0.0

    def start(self) -> None:
        """Training starts (or resumes): the first step is timed from here."""
        self._last = self._clock()
        self._blocked = 0.0

    def add_blocked(self, seconds: float) -> None:
        """This rank spent ``seconds`` in a checkpoint since the last lap."""
        self._blocked += max(0.0, seconds)

    def lap(self) -> RankTimes:
        """The step that just ended: its time net of blocking, and the blocking (0, 0 before start)."""
        now = self._clock()
        last, blocked = self._last, self._blocked
        self._last, self._blocked = now, 0.0
        if last is None:
            return RankTimes(0.0, 0.0)
        return RankTimes(max(0.0, now - last - blocked), blocked)
