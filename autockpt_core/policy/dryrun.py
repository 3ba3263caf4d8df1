"""Dry run: drive the real policy, profiler and adjusters through a synthetic run on a fake clock.

Used by the tests and the benchmark to check re-tuning and the online front-loaded schedule
without training anything or sleeping. It feeds the :class:`~autockpt_core.policy.profiler.Profiler`
and the :class:`~autockpt_core.policy.decision.CheckpointPolicy` exactly as
:class:`~autockpt_core.session.CheckpointSession` does (same calls, same order), with
iteration time, stall, persist time, background slowdown and loss given as functions of the
step. A persist runs in the "background" for its duration after the stall; iterations that start
while it runs take ``(1 + slowdown)`` times longer.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..config import Config
from .decision import AdjusterSpec, CheckpointPolicy
from .profiler import Profiler

StepFn = Callable[[int], float]
EPS = 1e-9  # clock comparisons tolerate float rounding of summed step times


def constant(value: float) -> StepFn:
    return lambda step: value


def switch(at_step: int, before: float, after: float) -> StepFn:
    """``before`` until ``at_step`` (exclusive), ``after`` from then on."""
    return lambda step: before if step < at_step else after


@dataclasses.dataclass
class Scenario:
    """What a synthetic run's steps and checkpoints cost, as functions of the step."""

    iter_time: StepFn = dataclasses.field(default_factory=lambda: constant(0.1))
    stall: StepFn = dataclasses.field(default_factory=lambda: constant(0.05))
    persist: StepFn = dataclasses.field(default_factory=lambda: constant(0.5))
    slowdown: StepFn = dataclasses.field(default_factory=lambda: constant(0.0))
    loss: Callable[[int], float | None] = lambda step: None


@dataclasses.dataclass(frozen=True)
class CheckpointEvent:
    """A checkpoint of the dry run: step, clock after the stall, interval in force and its rule."""

    step: int
    time: float
    interval_steps: int | None
    rule: str | None


@dataclasses.dataclass
class Trace:
    """What happened: every checkpoint, and per step its end time and clean (ideal) duration."""

    checkpoints: list[CheckpointEvent]
    step_end: list[float]
    ideal: list[float]
    policy: CheckpointPolicy

    def overhead(self, first_step: int, last_step: int) -> float:
        """True overhead over steps ``(first_step, last_step]``: extra wall time / ideal time."""
        wall = self.step_end[last_step] - self.step_end[first_step]
        ideal = sum(self.ideal[first_step + 1 : last_step + 1])
        return wall / ideal - 1.0

    def intervals(self) -> list[int]:
        """Interval in force (steps) at each checkpoint after profiling."""
        return [c.interval_steps for c in self.checkpoints if c.interval_steps is not None]


def dry_run(
    config: Config, scenario: Scenario, steps: int, adjusters: AdjusterSpec = None, nbytes: int = 1 << 20
) -> Trace:
    """Run ``steps`` optimizer steps through policy + profiler on a fake clock; return the trace."""
    profiler = Profiler(config.warmup_steps, config.profile_window)
    policy = CheckpointPolicy(config, adjusters)
    now = 0.0
    policy.start(now, 0)
    busy_until: float | None = None
    persist_len = 0.0
    loaded_next = False
    events: list[CheckpointEvent] = []
    step_end = [0.0]
    ideal = [0.0]
    for step in range(1, steps + 1):
        t = scenario.iter_time(step)
        busy_at_start = busy_until is not None and now < busy_until - EPS
        duration = t * (1.0 + scenario.slowdown(step)) if busy_at_start else t
        now += duration
        if busy_until is not None and now >= busy_until - EPS:
            profiler.record_persist(persist_len)
            busy_until = None
        busy = busy_until is not None
        profiler.record_iteration(duration, loaded=loaded_next or busy_at_start or busy)
        loaded_next = busy
        step_end.append(now)
        ideal.append(t)
        loss = scenario.loss(step)
        decision = policy.decide(step, now, profiler.step_reading(), busy, loss=loss)
        if decision.save:
            stall = scenario.stall(step)
            now += stall
            step_end[-1] = now
            profiler.record_stall(stall, nbytes)
            policy.record_checkpoint(step, now)
            persist_len = scenario.persist(step)
            busy_until = now + persist_len
            loaded_next = True
            cur = policy.current
            events.append(CheckpointEvent(step, now, cur.steps if cur else None, cur.rule if cur else None))
    return Trace(events, step_end, ideal, policy)
