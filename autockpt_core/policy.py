"""When to checkpoint: the interval choice and the per-step decision.

``choose_interval`` is a pure function of the config and the profiler's estimates.
``CheckpointPolicy`` adds the little state a decision needs (the last checkpoint's step and
time); it never reads a clock itself: the caller passes ``now``.

Call order (training thread): ``decide(step, now, estimates, persist_busy)`` after every
optimizer step; when it says save and the checkpoint was taken, ``record_checkpoint(step, now)``.

Extension point: ``interval_adjuster`` (a callable taking the base ``IntervalChoice``, the
estimates and the seconds since training started, returning a new ``IntervalChoice``) is where
the front-loaded schedule and adaptive re-tuning plug in.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

from .config import Config
from .intervals import (
    budget_interval_steps,
    daly_interval,
    persist_interval_steps,
    seconds_to_steps,
    young_interval,
)
from .profiler import Estimates

#: Clean iterations (after warm-up) to measure before the first, profiling checkpoint.
MIN_PROFILE_ITERATIONS = 5


@dataclasses.dataclass(frozen=True)
class IntervalChoice:
    """An interval and why it was chosen.

    ``candidates`` maps each rule considered ("budget", "persist", "young", "daly",
    "min_interval", "max_interval", ...) to the interval in steps it asked for; ``rule`` names
    the one that decided.
    """

    steps: int
    seconds: float
    rule: str
    candidates: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def explain(self) -> str:
        parts = ", ".join(f"{k}={v}" for k, v in self.candidates.items())
        return f"{self.steps} steps (~{self.seconds:.3g}s) set by {self.rule} [{parts}]"


@dataclasses.dataclass(frozen=True)
class Decision:
    """Answer to "checkpoint now?" with the reason and the interval in force."""

    save: bool
    reason: str
    interval: IntervalChoice | None = None


IntervalAdjuster = Callable[[IntervalChoice, Estimates, float], IntervalChoice]


def choose_interval(config: Config, est: Estimates) -> IntervalChoice:
    """The interval for the current estimates (requires ``est.ready`` unless every_n_steps is set).

    Rules: the budget bound (stall / (k·t) ≤ budget) and the persist bound (no new checkpoint
    before the previous persist finished) give the densest allowed interval. With an MTBF, the
    Daly optimum is used, but never denser than those bounds. ``min_interval``/``max_interval``
    clamp the result; an explicit ``max_interval`` wins over the budget.
    """
    if config.every_n_steps is not None:
        steps = config.every_n_steps
        seconds = steps * (est.iter_time_s or 0.0)
        return IntervalChoice(steps, seconds, "every_n_steps", {"every_n_steps": steps})
    if not est.ready:
        raise ValueError("choose_interval needs measured iteration time, stall and persist time")
    t = float(est.iter_time_s)  # type: ignore[arg-type]
    stall = float(est.stall_s)  # type: ignore[arg-type]
    persist = float(est.persist_s)  # type: ignore[arg-type]
    t = max(t, 1e-9)
    candidates: dict[str, int] = {
        "budget": budget_interval_steps(stall, t, config.overhead_budget),
        "persist": persist_interval_steps(persist, stall, t),
    }
    rule = max(("budget", "persist"), key=lambda r: candidates[r])
    steps = candidates[rule]
    if config.mtbf is not None:
        cost = max(stall, 1e-6)
        candidates["young"] = seconds_to_steps(young_interval(cost, config.mtbf), t)
        candidates["daly"] = seconds_to_steps(daly_interval(cost, config.mtbf), t)
        if candidates["daly"] > steps:
            rule, steps = "daly", candidates["daly"]
    if config.min_interval is not None:
        candidates["min_interval"] = max(1, math.ceil(config.min_interval / t))
        if candidates["min_interval"] > steps:
            rule, steps = "min_interval", candidates["min_interval"]
    if config.max_interval is not None:
        candidates["max_interval"] = max(1, math.floor(config.max_interval / t))
        if candidates["max_interval"] < steps:
            rule, steps = "max_interval", candidates["max_interval"]
    return IntervalChoice(steps, steps * t, rule, candidates)


class CheckpointPolicy:
    """Answers "checkpoint now?" from explicit inputs.

    Phases: while the profiler is still in warm-up nothing is saved; then one profiling
    checkpoint measures stall and persist time; from then on the interval from
    :func:`choose_interval` (optionally adjusted) is used. A due checkpoint is deferred, not
    blocked on, while the previous persist is still running (except with ``every_n_steps``,
    where the user asked for exact steps).
    """

    def __init__(self, config: Config, interval_adjuster: IntervalAdjuster | None = None) -> None:
        self.config = config
        self._adjust = interval_adjuster
        self._start: float | None = None
        self._last_step: int | None = None
        self._last_time: float | None = None
        self.current: IntervalChoice | None = None
        self.deferred = 0

    def start(self, now: float, step: int = 0) -> None:
        """Mark the start of training (or of the resumed run) at ``step``."""
        self._start = now
        self._last_time = now
        self._last_step = step

    @property
    def last_checkpoint_step(self) -> int | None:
        return self._last_step

    def decide(self, step: int, now: float, est: Estimates, persist_busy: bool) -> Decision:
        """Whether to checkpoint after optimizer step ``step`` (the global step count)."""
        if self._start is None:
            self.start(now, step)
        cfg = self.config
        if cfg.every_n_steps is not None:
            self.current = choose_interval(cfg, est)
            if step > 0 and step % cfg.every_n_steps == 0 and step != self._last_step:
                return Decision(True, f"every_n_steps={cfg.every_n_steps}", self.current)
            return Decision(False, "fixed interval not reached", self.current)

        since_time = now - (self._last_time if self._last_time is not None else now)
        since_steps = step - (self._last_step if self._last_step is not None else step)
        if since_steps <= 0:
            return Decision(False, "no new step since the last checkpoint", self.current)
        if cfg.max_interval is not None and since_time >= cfg.max_interval:
            return self._due(persist_busy, f"max_interval={cfg.max_interval:g}s elapsed")
        if not est.ready:
            clean = est.iterations_seen - cfg.warmup_steps
            if est.checkpoints_seen == 0 and est.iter_time_s is not None and clean >= MIN_PROFILE_ITERATIONS:
                return self._due(persist_busy, "profiling: first checkpoint measures stall and persist")
            return Decision(False, "profiling", None)

        choice = choose_interval(cfg, est)
        if self._adjust is not None:
            elapsed = now - self._start  # type: ignore[operator]
            choice = self._adjust(choice, est, elapsed)
        self.current = choice
        if cfg.min_interval is not None and since_time < cfg.min_interval:
            return Decision(False, "min_interval not reached", choice)
        if since_steps >= choice.steps:
            return self._due(persist_busy, f"interval {choice.steps} steps reached ({choice.rule})")
        return Decision(False, "interval not reached", choice)

    def _due(self, persist_busy: bool, reason: str) -> Decision:
        if persist_busy:
            self.deferred += 1
            return Decision(False, f"{reason}; deferred: previous persist still running", self.current)
        return Decision(True, reason, self.current)

    def record_checkpoint(self, step: int, now: float) -> None:
        """Tell the policy a checkpoint was taken after ``step`` at time ``now``."""
        self._last_step = step
        self._last_time = now
