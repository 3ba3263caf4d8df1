"""When to checkpoint: the interval choice and the per-step decision.

``choose_interval`` is a pure function of the interval settings (:class:`IntervalRules`) and
the profiler's estimates.
``CheckpointPolicy`` adds the little state a decision needs (the last checkpoint's step and
time); it never reads a clock itself: the caller passes ``now``.

Call order (training thread): ``start(now, step)`` once; ``expect_end(step)`` whenever the
step training ends at with a final checkpoint is known or changes; ``observe_step(step, now,
persist_busy, loss)`` after every optimizer step and ``decide(step, now, estimates,
persist_busy, observe=False)`` after the newest one whenever the caller asks (at least at the
``next_step``/``next_time`` the previous decision gave; ``decide`` without ``observe=False``
observes its step itself); when it says save and the checkpoint was taken,
``record_checkpoint(step, now)``.

Extension point: interval adjusters. Each is a callable taking the base ``IntervalChoice``, the
estimates and the seconds since training started, returning a new ``IntervalChoice``; they run
in order, each on the previous one's output. Adjusters that subclass :class:`Adjuster` are also
told about the start, every step (with its loss) and every checkpoint. The front-loaded
schedule (``frontload.py``) and adaptive re-tuning (``adaptive.py``) plug in here;
``adjusters.adjusters_from_config`` builds them from the config.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Callable, Mapping, Sequence, Union

from ..config import Config
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
#: ``Decision.next_step`` when only time can make a checkpoint due (``min_interval``).
NO_STEP = sys.maxsize


@dataclasses.dataclass(frozen=True)
class IntervalChoice:
    """An interval and why it was chosen.

    ``candidates`` maps each rule considered ("budget", "persist", "young", "daly",
    "min_interval", "max_interval", ...) to the interval in steps it asked for; ``rule`` names
    the one that decided (adjusters prefix theirs: "adaptive:budget", "front_loaded:daly").
    ``cost_s`` is the training time one checkpoint was taken to cost; ``note`` is a free-text
    reason from an adjuster (e.g. why the front-loaded schedule fell back to uniform).
    """

    steps: int
    seconds: float
    rule: str
    candidates: Mapping[str, int] = dataclasses.field(default_factory=dict)
    cost_s: float | None = None
    note: str = ""

    def explain(self) -> str:
        parts = ", ".join(f"{k}={v}" for k, v in self.candidates.items())
        text = f"{self.steps} steps (~{self.seconds:.3g}s) set by {self.rule} [{parts}]"
        if self.cost_s is not None:
            text += f"; cost {self.cost_s:.3g}s per checkpoint"
        if self.note:
            text += f"; {self.note}"
        return text


@dataclasses.dataclass(frozen=True)
class Decision:
    """Answer to "checkpoint now?" with the reason and the interval in force.

    ``next_step`` and ``next_time``: no checkpoint is due before this step, nor before this time
    (the policy's clock), unless the estimates change; None: it may be due at the next step
    (profiling, a deferral) or at any time. The driver's hot path asks again only then.
    """

    save: bool
    reason: str
    interval: IntervalChoice | None = None
    next_step: int | None = None
    next_time: float | None = None


IntervalAdjuster = Callable[[IntervalChoice, Estimates, float], IntervalChoice]


class Adjuster:
    """Base class of stateful interval adjusters; every hook is optional (no-op here).

    Call order (training thread, driven by :class:`CheckpointPolicy`): ``observe_start`` when
    training starts or resumes; ``observe_step`` after every optimizer step, before
    ``adjust``; ``adjust`` whenever the policy needs the interval (once profiling is done);
    ``observe_checkpoint`` after each checkpoint was taken. Not thread-safe by design: only the
    training thread calls it.
    """

    def observe_start(self, step: int, now: float) -> None:
        """Training starts (or resumes) at ``step``; windows measured before are void."""

    def observe_step(self, step: int, now: float, persist_busy: bool, loss: float | None) -> None:
        """Optimizer step ``step`` ended at ``now``; ``loss`` is its training loss if known."""

    def observe_checkpoint(self, step: int, now: float) -> None:
        """A checkpoint after ``step`` finished its stall at ``now``."""

    def adjust(self, choice: IntervalChoice, est: Estimates, elapsed_s: float) -> IntervalChoice:
        """Return the interval to use instead of ``choice`` (default: ``choice`` unchanged)."""
        return choice

    def __call__(self, choice: IntervalChoice, est: Estimates, elapsed_s: float) -> IntervalChoice:
        return self.adjust(choice, est, elapsed_s)


AdjusterSpec = Union[IntervalAdjuster, Sequence[IntervalAdjuster], None]


@dataclasses.dataclass(frozen=True)
class IntervalRules:
    """The settings :func:`choose_interval` reads (seconds; see :class:`~autockpt_core.config.Config`)."""

    budget: float
    mtbf: float | None = None
    every_n_steps: int | None = None
    min_interval: float | None = None
    max_interval: float | None = None

    @classmethod
    def of(cls, config: Config) -> IntervalRules:
        return cls(config.overhead_budget, config.mtbf, config.every_n_steps, config.min_interval, config.max_interval)

    def with_budget(self, budget: float) -> IntervalRules:
        return dataclasses.replace(self, budget=budget)


def choose_interval(rules: IntervalRules, est: Estimates, cost_s: float | None = None) -> IntervalChoice:
    """The interval for the current estimates (requires ``est.ready`` unless every_n_steps is set).

    The budget is the checkpoints' alone: autockpt's own per-step work is measured and reported
    beside it (docs/policy.md, "The budget is for checkpoints"). Rules:

    * without an MTBF, the densest interval the bounds allow: the budget bound (cost / (k·t) ≤
      budget) with the cost bounded from above (``Estimates.checkpoint_cost_s``: the stall plus
      the background slowdown's upper bound, the whole persist time until that is measured), so
      the interval approaches the budget from below; and the persist bound (no new checkpoint
      before the previous persist finished);
    * with an MTBF, the Daly optimum for the best estimate of the cost
      (``Estimates.expected_cost_s``), unless that cost at that interval exceeds the budget
      (then the budget bound at that cost), and never before the previous persist finished.

    ``min_interval``/``max_interval`` clamp the result; an explicit ``max_interval`` wins over
    the budget. ``cost_s``: a measured cost per checkpoint that replaces both estimates (the
    adaptive tuner passes the one it measured over recent checkpoint windows).
    """
    if rules.every_n_steps is not None:
        steps = rules.every_n_steps
        seconds = steps * (est.iter_time_s or 0.0)
        return IntervalChoice(steps, seconds, "every_n_steps", {"every_n_steps": steps})
    if not est.ready:
        raise ValueError("choose_interval needs measured iteration time, stall and persist time")
    t = max(float(est.iter_time_s), 1e-9)  # type: ignore[arg-type]
    stall = float(est.stall_s)  # type: ignore[arg-type]
    persist = float(est.persist_s)  # type: ignore[arg-type]
    expected = float(cost_s) if cost_s is not None else float(est.expected_cost_s)  # type: ignore[arg-type]
    if rules.mtbf is None:
        cost = float(cost_s) if cost_s is not None else float(est.checkpoint_cost_s)  # type: ignore[arg-type]
    else:
        cost = expected
    candidates: dict[str, int] = {
        "budget": budget_interval_steps(cost, t, rules.budget),
        "persist": persist_interval_steps(persist, stall, t),
    }
    if rules.mtbf is not None:
        daly_cost = max(expected, 1e-6)
        candidates["young"] = seconds_to_steps(young_interval(daly_cost, rules.mtbf), t)
        candidates["daly"] = seconds_to_steps(daly_interval(daly_cost, rules.mtbf), t)
        rule = max(("daly", "budget", "persist"), key=lambda r: candidates[r])
    else:
        rule = max(("budget", "persist"), key=lambda r: candidates[r])
    steps = candidates[rule]
    if rules.min_interval is not None:
        candidates["min_interval"] = max(1, math.ceil(rules.min_interval / t))
        if candidates["min_interval"] > steps:
            rule, steps = "min_interval", candidates["min_interval"]
    if rules.max_interval is not None:
        candidates["max_interval"] = max(1, math.floor(rules.max_interval / t))
        if candidates["max_interval"] < steps:
            rule, steps = "max_interval", candidates["max_interval"]
    return IntervalChoice(steps, steps * t, rule, candidates, cost_s=cost)


def _as_list(spec: AdjusterSpec) -> list[IntervalAdjuster]:
    if spec is None:
        return []
    if callable(spec):
        return [spec]
    return list(spec)


class CheckpointPolicy:
    """Answers "checkpoint now?" from explicit inputs.

    Phases: while the profiler is still in warm-up nothing is saved; then one profiling
    checkpoint measures stall and persist time; from then on the interval from
    :func:`choose_interval`, passed through the adjusters in order, is used. A due checkpoint
    is deferred, not blocked on, while the previous persist is still running (except with
    ``every_n_steps``, where the user asked for exact steps). An interval checkpoint is
    skipped when the final checkpoint (``expect_end``) comes before it would be durable: it
    would only make the final one wait for its persist.
    """

    def __init__(self, config: Config, interval_adjuster: AdjusterSpec = None) -> None:
        self.config = config
        self.rules = IntervalRules.of(config)
        self.adjusters: list[IntervalAdjuster] = _as_list(interval_adjuster)
        self._start: float | None = None
        self._last_step: int | None = None
        self._last_time: float | None = None
        self.current: IntervalChoice | None = None
        self.deferred = 0
        self.end_step: int | None = None
        self._chosen: tuple[Estimates, IntervalChoice] | None = None  # the last reading's choice

    def _observers(self) -> list[Adjuster]:
        return [a for a in self.adjusters if isinstance(a, Adjuster)]

    def _chosen_for(self, est: Estimates) -> IntervalChoice:
        """:func:`choose_interval` for ``est``, computed once per reading (a per-step decision
        reuses one reading for several steps: :meth:`Profiler.step_reading`)."""
        if self._chosen is None or self._chosen[0] is not est:
            self._chosen = (est, choose_interval(self.rules, est))
        return self._chosen[1]

    def start(self, now: float, step: int = 0) -> None:
        """Mark the start of training (or of the resumed run) at ``step``."""
        self._start = now
        self._last_time = now
        self._last_step = step
        for adj in self._observers():
            adj.observe_start(step, now)

    def expect_end(self, step: int | None) -> None:
        """Training ends after optimizer step ``step`` with a final checkpoint (None: not known,
        or no final checkpoint). An estimate is enough: a wrong one delays a checkpoint by at
        most one persist's time."""
        self.end_step = step

    @property
    def last_checkpoint_step(self) -> int | None:
        return self._last_step

    def observe_step(self, step: int, now: float, persist_busy: bool, loss: float | None = None) -> None:
        """Optimizer step ``step`` ended at ``now`` (tells the adjusters; :meth:`decide` does it
        for its own step unless ``observe=False``)."""
        if self._start is None:
            self.start(now, step)
        for adj in self._observers():
            adj.observe_step(step, now, persist_busy, loss)

    def decide(
        self, step: int, now: float, est: Estimates, persist_busy: bool, loss: float | None = None,
        *, observe: bool = True,
    ) -> Decision:  # fmt: skip
        """Whether to checkpoint after optimizer step ``step`` (the global step count); with
        ``observe``, :meth:`observe_step` first. The decision says when to ask again."""
        if observe:
            self.observe_step(step, now, persist_busy, loss)
        elif self._start is None:
            self.start(now, step)
        cfg = self.config
        if cfg.every_n_steps is not None:
            n = cfg.every_n_steps
            self.current = self._chosen_for(est)
            following = (step // n + 1) * n
            if step > 0 and step % n == 0 and step != self._last_step:
                return Decision(True, f"every_n_steps={n}", self.current)
            return Decision(False, "fixed interval not reached", self.current, next_step=following)

        last_time = self._last_time if self._last_time is not None else now
        last_step = self._last_step if self._last_step is not None else step
        since_time, since_steps = now - last_time, step - last_step
        deadline = last_time + cfg.max_interval if cfg.max_interval is not None else None
        if since_steps <= 0:
            return Decision(False, "no new step since the last checkpoint", self.current)
        if deadline is not None and now >= deadline:
            return self._due(persist_busy, f"max_interval={cfg.max_interval:g}s elapsed")
        if not est.ready:
            clean = est.iterations_seen - cfg.warmup_steps
            if est.checkpoints_seen == 0 and est.iter_time_s is not None and clean >= MIN_PROFILE_ITERATIONS:
                return self._due(persist_busy, "profiling: first checkpoint measures stall and persist")
            if est.checkpoints_seen > 0 and est.iter_time_s is None:
                return Decision(False, "re-profiling: measuring clean iterations", self.current)
            return Decision(False, "profiling", None)

        choice = self.interval(est, now)
        if cfg.min_interval is not None and since_time < cfg.min_interval:
            wait = last_time + cfg.min_interval
            return Decision(False, "min_interval not reached", choice, next_step=NO_STEP,
                            next_time=min(wait, deadline) if deadline is not None else wait)
        if since_steps >= choice.steps:
            reason = f"interval {choice.steps} steps reached ({choice.rule})"
            if self._final_comes_first(step, est):
                return Decision(False, f"{reason}; skipped: the final checkpoint after step {self.end_step} "
                                "comes before this one would be durable", choice, self.end_step, deadline)
            return self._due(persist_busy, reason)
        return Decision(False, "interval not reached", choice, last_step + choice.steps, deadline)

    def _final_comes_first(self, step: int, est: Estimates) -> bool:
        """Whether the final checkpoint is taken before a checkpoint started now would be
        durable (its stall plus its persist)."""
        end = self.end_step
        if end is None or end <= step or est.iter_time_s is None or est.persist_s is None:
            return False
        return (end - step) * est.iter_time_s < (est.stall_s or 0.0) + est.persist_s

    def interval(self, est: Estimates, now: float) -> IntervalChoice:
        """The interval in force now: :func:`choose_interval` passed through the adjusters."""
        choice = self._chosen_for(est)
        elapsed = now - (self._start if self._start is not None else now)
        for adj in self.adjusters:
            choice = adj(choice, est, elapsed)
        self.current = choice
        return choice

    def _due(self, persist_busy: bool, reason: str) -> Decision:
        if persist_busy:
            self.deferred += 1
            return Decision(False, f"{reason}; deferred: previous persist still running", self.current)
        return Decision(True, reason, self.current)

    def record_checkpoint(self, step: int, now: float) -> None:
        """Tell the policy a checkpoint was taken after ``step`` at time ``now``."""
        self._last_step = step
        self._last_time = now
        for adj in self._observers():
            adj.observe_checkpoint(step, now)

    def explain(self) -> str:
        """One line: the interval in force and why (or that profiling is still running)."""
        if self.current is None:
            return "no interval yet: profiling iteration time, stall and persist time"
        return self.current.explain()
