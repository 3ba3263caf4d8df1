"""What one checkpoint cost the training, measured: the input of :class:`~.mode_trial.ModeTrial`.

A checkpoint costs more than the time its hook blocks. The snapshot copy may overlap the next
step (a wait before that step's optimizer update, and a slower forward/backward), and the
background persist slows the steps it overlaps. :class:`CostMeter` adds all of it up for one
checkpoint, from numbers the engine already has:

1. ``begin(mode, stall_s, nbytes, iter_time_s, step_s, step_sd_s)`` when the checkpoint's
   hook returns (``iter_time_s``: the profiler's clean median, the conditions the cost was
   measured in; ``step_s``: the median of the latest :data:`~.profiler.RECENT` clean
   iterations, ``recent_iter_time_s``, which the steps around the checkpoint are compared
   with; ``step_sd_s``: the clean steps' spread, ``iter_sd_s``, from which the excess's noise
   is known; ``iter_time_s`` or ``step_s`` None: nothing is measured);
2. ``add_wait(seconds)`` for each wait for the copy before an optimizer update;
3. ``add_step(seconds)`` for each step that ran while the copy or the persist was in flight
   (its own stall already subtracted);
4. ``finish()`` once the copy and the persist are done: the :class:`CheckpointCost`, or None
   when there was no clean iteration time to compare the steps with.

Pure (no clock, no threads): the engine calls it on the training thread.
"""

from __future__ import annotations

import dataclasses
import math

from .profiler import RECENT

#: One step counts at most this many clean iteration times of excess (a page-cache flush or a
#: GC pause must not decide the mode alone; the profiler caps its slowdown mean the same way).
STEP_EXCESS_CAP = 5.0
#: Standard error of a median of n normal samples ≈ this × σ / √n.
MEDIAN_SE = 1.2533


@dataclasses.dataclass(frozen=True)
class CheckpointCost:
    """One checkpoint's measured cost in seconds of training time.

    ``stall_s``: the hook's blocked time plus the waits for the copy before the next update.
    ``excess_s``: the extra time of the steps that overlapped the copy or the persist, over
    the latest clean steps (may be negative: noise). ``steps``: how many steps that was.
    ``iter_time_s``: the clean median (window) when it was measured. ``nbytes``: the
    checkpoint's tensor bytes. ``mode``: its snapshot copy mode. ``excess_sd_s``: the standard
    deviation of ``excess_s`` that step-to-step noise alone gives (each step's own spread
    plus the error of the reference they are compared with; 0: unknown).
    """

    mode: str
    stall_s: float
    excess_s: float
    steps: int
    iter_time_s: float
    nbytes: int
    excess_sd_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.stall_s + self.excess_s


@dataclasses.dataclass
class _Measuring:
    mode: str
    stall_s: float
    iter_time_s: float
    nbytes: int
    step_s: float
    step_sd_s: float
    excess_s: float = 0.0
    steps: int = 0


class CostMeter:
    """Adds up one checkpoint's cost at a time; see the module docstring for the call order."""

    def __init__(self) -> None:
        self._open: _Measuring | None = None

    @property
    def measuring(self) -> bool:
        return self._open is not None

    def begin(
        self,
        mode: str | None,
        stall_s: float,
        nbytes: int,
        iter_time_s: float | None,
        step_s: float | None = None,
        step_sd_s: float | None = None,
    ) -> None:
        """A checkpoint's hook returned. Without a mode or a clean iteration time, nothing is
        measured (``finish`` returns None). ``step_s`` defaults to ``iter_time_s``;
        ``step_sd_s`` None: the noise is unknown (``excess_sd_s`` 0)."""
        step_s = iter_time_s if step_s is None else step_s
        if mode is None or iter_time_s is None or iter_time_s <= 0 or step_s is None or step_s <= 0:
            self._open = None
            return
        sd = max(0.0, step_sd_s or 0.0)
        self._open = _Measuring(mode, max(0.0, stall_s), iter_time_s, int(nbytes), step_s, sd)

    def add_wait(self, seconds: float) -> None:
        if self._open is not None:
            self._open.stall_s += max(0.0, seconds)

    def add_step(self, seconds: float) -> None:
        if self._open is None or seconds < 0:
            return
        clean = self._open.step_s
        self._open.excess_s += min(seconds, STEP_EXCESS_CAP * clean) - clean
        self._open.steps += 1

    def finish(self) -> CheckpointCost | None:
        """The cost of the checkpoint begun last (None if it was not measured); closes it."""
        m, self._open = self._open, None
        if m is None:
            return None
        return CheckpointCost(
            m.mode, m.stall_s, m.excess_s, m.steps, m.iter_time_s, m.nbytes, excess_noise(m.step_sd_s, m.steps)
        )


def excess_noise(step_sd_s: float, steps: int) -> float:
    """Standard deviation of an excess summed over ``steps`` steps, each ``step_sd_s`` noisy,
    all compared with one median of :data:`RECENT` clean steps (whose error counts ``steps``
    times): ``σ·√(n + (n·1.2533/√RECENT)²)``."""
    reference = steps * MEDIAN_SE / math.sqrt(RECENT)
    return step_sd_s * math.sqrt(steps + reference * reference)
