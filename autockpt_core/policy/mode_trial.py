"""``snapshot_mode="auto"``: try the candidate copy modes, keep the cheapest measured one.

Which copy mode costs training least depends on the machine (a core left free for the copy
thread, memory bandwidth, a GPU's copy engine), the model and what else runs; a rule of thumb
guessed wrong on the project's own benchmark machines. So "auto" measures:

1. **Trying.** The first ``trials × len(candidates)`` measured checkpoints take the candidates
   in turn (interleaved, the adapter's first guess first, so slow drift of the machine
   weighs on every mode alike). Each reports its :class:`~.checkpoint_cost.CheckpointCost`:
   blocked time, waits before the next update and the slowdown of the steps around it.
2. **Chosen.** A cost has two parts measured with very different precision: the *blocked*
   time (the hook's stall and the waits before the next update) is timed directly and
   varies little, while the *slowdown* of the steps around the checkpoint is the difference
   between a few steps and a reference, and carries the machine's step-to-step noise (on
   the project's 2-core machine at 1 GB, intervals of 10 identical steps vary by ±1 s, more
   than the modes differ). So a mode M is compared with ``baseline`` ("sync") part by part:

   - its blocked-time saving (medians) counts when it exceeds the blocked readings' range;
   - its extra slowdown (medians of the excess) counts only when it exceeds the noise band:
     ``SIGNIFICANCE`` standard errors of the difference, from each reading's
     ``excess_sd_s`` (the clean steps' spread), and the excess readings' range; inside the
     band it is taken as 0;
   - M is kept if the saving less the counted slowdown exceeds ``margin`` × the baseline's
     median blocked time; among several such modes, the one that saves most.

   The margin is scaled by the blocked time, not the total, because the persist's slowdown
   of the steps it overlaps is common to every mode and can dwarf the rest (1 GB: ~1.1 s of
   ~1.25 s per checkpoint). A mode that blocks less but slows the steps measurably more
   (a copy thread on a core training needs) loses; noise decides nothing.
3. **Re-trying** when the conditions drift: a checkpoint whose clean iteration time or size
   differs from the trial's median by more than ``drift`` (a fraction) starts step 1 again.

Pure: fed costs, it answers which mode the next checkpoint uses. Call order (training thread):
``next_mode()`` when a snapshot starts, ``record(cost)`` when that checkpoint's cost is known;
a checkpoint whose cost never comes (no clean iteration time yet) is simply tried again.
``record`` returns a sentence to log when the state changes (a choice, a re-trial).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from .checkpoint_cost import CheckpointCost

TRIALS = 2
"""Measured checkpoints per candidate before choosing."""
MARGIN = 0.1
"""A mode other than the baseline must cost less than it by this fraction of its blocked time."""
DRIFT = 0.3
"""Relative change of iteration time or checkpoint size that starts a new trial."""
SIGNIFICANCE = 2.0
"""Standard errors a difference in slowdown must exceed to count (about 95%)."""


class ModeTrial:
    """Chooses a snapshot copy mode by measured cost; see the module docstring."""

    def __init__(
        self,
        candidates: Sequence[str],
        *,
        baseline: str = "sync",
        trials: int = TRIALS,
        margin: float = MARGIN,
        drift: float = DRIFT,
    ) -> None:
        modes = tuple(dict.fromkeys(candidates))
        if not modes:
            raise ValueError("ModeTrial needs at least one candidate mode")
        if baseline not in modes:
            raise ValueError(f"baseline {baseline!r} is not among the candidates {modes}")
        if trials < 1:
            raise ValueError(f"trials must be >= 1, got {trials}")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        if drift <= 0:
            raise ValueError(f"drift must be > 0, got {drift}")
        self.candidates = modes
        self.baseline = baseline
        self.trials = trials
        self.margin = margin
        self.drift = drift
        self.chosen: str | None = None if len(modes) > 1 else modes[0]
        self.reason = "only candidate" if self.chosen is not None else "trying " + ", ".join(modes)
        self.rounds = 0
        """Completed trials (1 after the first choice; more after re-trials)."""
        self._costs: list[CheckpointCost] = []
        self.measured: list[CheckpointCost] = []
        """Every trial checkpoint's cost, all rounds (for reports)."""
        self._reference: tuple[float, float] | None = None  # (iteration time, bytes) of the trial

    @property
    def trying(self) -> bool:
        return self.chosen is None

    def next_mode(self) -> str:
        """The mode the next snapshot uses."""
        if self.chosen is not None:
            return self.chosen
        return self.candidates[len(self._costs) % len(self.candidates)]

    def record(self, cost: CheckpointCost) -> str | None:
        """One checkpoint's measured cost; a sentence to log when the mode is chosen or re-tried."""
        if self.chosen is None:
            if cost.mode != self.next_mode():
                return None  # not this trial's checkpoint (e.g. one taken before it began)
            self._costs.append(cost)
            self.measured.append(cost)
            if len(self._costs) >= self.trials * len(self.candidates):
                return self._choose()
            return None
        if self._reference is None or len(self.candidates) == 1:
            return None
        iter_ref, bytes_ref = self._reference
        moved = _moved(cost.iter_time_s, iter_ref, self.drift) or _moved(cost.nbytes, bytes_ref, self.drift)
        if not moved:
            return None
        self.chosen, self._costs, self._reference = None, [], None
        self.reason = "re-trying " + ", ".join(self.candidates)
        return (
            f"conditions changed (iteration {iter_ref * 1e3:.1f} -> {cost.iter_time_s * 1e3:.1f} ms, "
            f"checkpoint {bytes_ref / 2**20:.0f} -> {cost.nbytes / 2**20:.0f} MiB); "
            f"trying the snapshot copy modes {', '.join(self.candidates)} again"
        )

    def _choose(self) -> str:
        readings = {mode: [c for c in self._costs if c.mode == mode] for mode in self.candidates}
        stall = {m: statistics.median(c.stall_s for c in rs) for m, rs in readings.items()}
        excess = {m: statistics.median(c.excess_s for c in rs) for m, rs in readings.items()}
        base = self.baseline
        needed = self.margin * stall[base]
        savings: dict[str, float] = {}
        notes: list[str] = []
        for mode in self.candidates:
            if mode == base:
                continue
            blocked_saving = stall[base] - stall[mode]
            if abs(blocked_saving) <= max(_spread_of(readings, mode, "stall_s"), _spread_of(readings, base, "stall_s")):
                blocked_saving = 0.0
            extra = excess[mode] - excess[base]
            band = max(
                SIGNIFICANCE * math.hypot(_standard_error(readings[mode]), _standard_error(readings[base])),
                _spread_of(readings, mode, "excess_s"),
                _spread_of(readings, base, "excess_s"),
            )
            counted = extra if abs(extra) > band else 0.0
            savings[mode] = blocked_saving - counted
            notes.append(
                f"{mode} blocks {stall[mode] * 1e3:.1f} ms, slows the steps {extra * 1e3:+.1f} ms vs {base} "
                f"({'counted' if counted else 'within'} the noise band of {band * 1e3:.1f} ms)"
            )
        kept = [m for m, saving in savings.items() if saving > needed]
        best = max(kept, key=lambda m: savings[m]) if kept else base
        self.chosen = best
        self.rounds += 1
        self._reference = (
            statistics.median(c.iter_time_s for c in self._costs),
            statistics.median(c.nbytes for c in self._costs),
        )
        self.reason = (
            f"auto: lowest measured cost per checkpoint (median of {self.trials}: {base} blocks "
            f"{stall[base] * 1e3:.1f} ms; " + "; ".join(notes)
            + f"; another mode must save more than {self.margin:.0%} of {base}'s blocked time)"
        )
        return f"snapshot copy mode {best} ({self.reason})"


def _standard_error(costs: list[CheckpointCost]) -> float:
    """Standard error of the mean excess of ``costs``, from each reading's own noise."""
    return math.sqrt(statistics.fmean(c.excess_sd_s**2 for c in costs) / len(costs))


def _spread_of(readings: dict[str, list[CheckpointCost]], mode: str, field: str) -> float:
    return _spread([getattr(c, field) for c in readings[mode]])


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if values else 0.0


def _moved(value: float, reference: float, drift: float) -> bool:
    if reference <= 0:
        return value > 0
    return abs(value - reference) > drift * reference
