"""Adaptive re-tuning: measure what checkpoints really cost and move the interval when it drifts.

Measurement (CheckFreq-style, but two-sided): between two consecutive checkpoints (a
*window*) the tuner knows the wall time, the number of steps and the duration of every step.
Steps that overlapped no checkpoint work (no stall, no persist running at either end) are
*clean*; their mean is the iteration time ``t`` of that window. The window's checkpoint cost is

    C = wall − steps · t

— the stall plus every slowdown the snapshot and the background persist caused (contention for
cores, memory bandwidth, page cache), not only the blocked time. Each window has its own ``t``,
so a change in iteration time is not mistaken for checkpoint overhead.

Giant steps (:mod:`.giant_steps`: over five times the window's clean mean, e.g. a machine's
20 s stall) would decide a window's cost alone: a clean one is left out of its window (wall
and steps) always; a loaded one (its duration counted from the end of the checkpoint's own
stall) only until giants are clearly more frequent among loaded steps than among clean ones,
judged at each decision over the whole fit.

Noise: each window's cost has a known floor of noise from iteration-time jitter (see
:attr:`Window.noise_sd`); spreads are never taken smaller than that, and bands use Student-t
quantiles, so a few lucky windows are not evidence. Windows in which the iteration time itself
moved are dropped; when the iteration time or the cost clearly shifts between windows, older
windows are forgotten (a change point), so the tuner reacts within a few checkpoints.

Decision, after each window once ``settle`` windows were measured since the last change: the
cost ``C`` is the mean over the recent windows (at most ``max_windows``, none from before the
last change or change point), with a 95% band. The target interval is
:func:`~autockpt_core.policy.decision.choose_interval` fed with the measured cost and iteration time,
aiming at ``target`` × budget (headroom below the budget). The interval approaches the budget
from below, with hysteresis:

* lengthen as soon as the overhead at the interval in force, at the measured mean cost,
  exceeds the budget, or when the optimum for the low end of the band is clearly longer;
* shorten only when even the high end of the band gives a target shorter than
  ``shorten_ratio`` × the interval in force (overhead well under budget: move toward the
  budget bound, or the Young/Daly optimum with an MTBF). The band narrows as windows
  accumulate, so the interval converges to the budget from the safe side;
* otherwise hold. A move against the previous one needs ``2·settle`` windows and goes only half
  way (geometric mean). Aiming inside the dead band keeps it from oscillating.

After a regime shift, a change point (the step time or the cost moved), or, before the tuner's
first change, a clear rise of the profiler-based interval, the first window of
the new regime may lengthen the interval on its own (never shorten it): the drift re-enters
from the safe side, and the usual rules resume once ``settle`` windows are measured.

Until its first change the tuner passes the profiler-based choice through unchanged.
Threading: training thread only (driven by :class:`~autockpt_core.policy.decision.CheckpointPolicy`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics

from ..config import Config
from .decision import Adjuster, IntervalChoice, IntervalRules, choose_interval
from .giant_steps import MIN_REFERENCE, GiantRates, is_giant
from .profiler import Estimates
from .stats import clearly_different, excess_sd, mean_sd, t_quantile

log = logging.getLogger("autockpt")

#: Relative change of the clean iteration time treated as a new regime (see :class:`Window`).
REGIME_SHIFT = 0.2
#: Relative change of the per-checkpoint cost (beyond noise) treated as a change point.
COST_SHIFT = 0.25


@dataclasses.dataclass(frozen=True)
class Window:
    """One measured checkpoint window.

    ``clean_iter_s``/``clean_sd``/``clean_n``: mean, standard deviation and count of its clean
    iterations (mean None when fewer than ``min_clean``). ``loaded_giants``: the durations of
    its giant loaded steps, which ``steps`` and ``wall_s`` include (its giant clean steps are
    left out of both).
    """

    end_step: int
    steps: int
    wall_s: float
    clean_iter_s: float | None
    clean_sd: float = 0.0
    clean_n: int = 0
    loaded_giants: tuple[float, ...] = ()

    def without_giants(self) -> Window:
        """This window with its giant loaded steps left out of its wall time and steps."""
        if not self.loaded_giants:
            return self
        return dataclasses.replace(self, steps=self.steps - len(self.loaded_giants),
                                   wall_s=self.wall_s - math.fsum(self.loaded_giants), loaded_giants=())

    def iter_time(self, fallback_iter_s: float) -> float:
        return self.clean_iter_s if self.clean_iter_s is not None else fallback_iter_s

    def cost(self, fallback_iter_s: float) -> float:
        """Checkpoint cost measured in this window: wall time minus the clean time of its steps."""
        return self.wall_s - self.steps * self.iter_time(fallback_iter_s)

    @property
    def noise_sd(self) -> float:
        """Standard deviation the cost has from iteration-time jitter alone.

        ``C = Σ_loaded (d − t̄) + stall``: ``n_l`` loaded iterations each with the clean spread,
        minus ``n_l`` times the clean mean's error: ``var = n_l·sd² + n_l²·sd²/n_c``.
        """
        if self.clean_iter_s is None or self.clean_n == 0:
            return 0.0
        return excess_sd(self.clean_sd, max(self.steps - self.clean_n, 0), self.clean_n)


@dataclasses.dataclass(frozen=True)
class Change:
    """One re-tuning: at ``step`` the interval went from ``old_steps`` to ``new_steps``."""

    step: int
    old_steps: int
    new_steps: int
    direction: str
    reason: str


class AdaptiveTuner(Adjuster):
    """Interval adjuster that re-tunes from measured windows; see the module docstring."""

    def __init__(
        self,
        config: Config,
        *,
        settle: int = 2,
        max_windows: int = 8,
        target: float = 0.9,
        shorten_ratio: float = 0.75,
        min_clean: int = 2,
    ) -> None:
        if not 0 < target <= 1:
            raise ValueError(f"target must be in (0, 1], got {target}")
        if not 0 < shorten_ratio < 1:
            raise ValueError(f"shorten_ratio must be in (0, 1), got {shorten_ratio}")
        if settle < 1 or max_windows < max(settle, 2):
            raise ValueError(f"need settle >= 1 and max_windows >= max(settle, 2), got {settle}, {max_windows}")
        self.config = config
        self._aim = IntervalRules.of(config).with_budget(config.overhead_budget * target)
        self.settle = settle
        self.max_windows = max_windows
        self.shorten_ratio = shorten_ratio
        self.min_clean = min_clean
        self.windows: list[Window] = []
        self.changes: list[Change] = []
        self.measured_cost_s: float | None = None
        self.measured_overhead: float | None = None
        self._choice: IntervalChoice | None = None
        self._since_change = 0
        self._pending = False
        self._t_ref: float | None = None  # newest clean iteration time measured in a window
        self._base_steps: int | None = None  # the base choice's interval at the last adjust()
        self.giants = GiantRates()
        self._reset_window()

    def _reset_window(self) -> None:
        self._win: tuple[int, float] | None = None
        self._clean: list[float] = []
        self._clean_sum = 0.0
        self._giant_steps: dict[bool, list[float]] = {False: [], True: []}  # by loaded, in this window
        self._prev: float | None = None
        self._prev_busy = False
        self._ckpt_since_prev = False

    # -- observation -----------------------------------------------------------------------

    def observe_start(self, step: int, now: float) -> None:
        self._reset_window()
        self.windows.clear()
        self._choice = None
        self._t_ref = None
        self._base_steps = None
        self._since_change = 0
        self._pending = False
        self.giants = GiantRates()

    def observe_step(self, step: int, now: float, persist_busy: bool, loss: float | None) -> None:
        if self._prev is not None:
            loaded = self._ckpt_since_prev or persist_busy or self._prev_busy
            after_stall = self._ckpt_since_prev and self._win is not None
            seconds = now - (self._win[1] if after_stall else self._prev)  # type: ignore[index]
            n = len(self._clean)
            giant = is_giant(seconds, self._clean_sum / n if n >= MIN_REFERENCE else self._t_ref)
            self.giants.count(loaded, giant)
            if giant:
                self._giant_steps[loaded].append(seconds)
            elif not loaded:
                self._clean.append(seconds)
                self._clean_sum += seconds
        self._prev, self._prev_busy, self._ckpt_since_prev = now, persist_busy, False

    def observe_checkpoint(self, step: int, now: float) -> None:
        if self._win is not None and step > self._win[0]:
            left_out = self._giant_steps[False]
            self._close_window(step, step - self._win[0] - len(left_out), now - self._win[1] - math.fsum(left_out))
        self._win = (step, now)
        self._clean = []
        self._clean_sum = 0.0
        self._giant_steps = {False: [], True: []}
        self._ckpt_since_prev = True

    def _close_window(self, step: int, steps: int, wall: float) -> None:
        clean = self._clean
        giants = tuple(self._giant_steps[True])
        if len(clean) < self.min_clean:
            win = Window(step, steps, wall, None, loaded_giants=giants)
        else:
            mean, sd = mean_sd(clean)
            win = Window(step, steps, wall, mean, sd, len(clean), giants)
            if len(clean) >= 2 * self.min_clean:  # iteration time moved inside the window: no cost
                half = len(clean) // 2
                (a, sa), (b, sb) = mean_sd(clean[:half]), mean_sd(clean[half:])
                if clearly_different(a, sa, half, b, sb, len(clean) - half, REGIME_SHIFT):
                    return
            if self._regime_shift(win):
                self.windows.clear()  # a new iteration-time regime: older costs may not apply
                self._since_change = min(self._since_change, self.settle - 1)
            self._t_ref = mean
        self.windows.append(win)
        del self.windows[: -self.max_windows]
        self._trim_change_point()
        self._since_change += 1
        self._pending = True

    def _regime_shift(self, win: Window) -> bool:
        """True if ``win``'s clean iteration time clearly differs from the recent windows' median."""
        ref = [w for w in self.windows if w.clean_iter_s is not None]
        if not ref or win.clean_iter_s is None:
            return False
        median = statistics.median(w.iter_time(0.0) for w in ref)
        sd = _rms([w.clean_sd for w in ref])
        n = min(w.clean_n for w in ref)
        return clearly_different(median, sd, n, win.clean_iter_s, win.clean_sd, win.clean_n, REGIME_SHIFT)

    def _counted(self, windows: list[Window]) -> list[Window]:
        """``windows`` as their cost counts now: giant loaded steps left out unless giants are
        clearly the checkpoints' (see the module docstring)."""
        return windows if self.giants.checkpoint_caused() else [w.without_giants() for w in windows]

    def _trim_change_point(self) -> None:
        """Forget older windows when the newest one or two measure a clearly different cost."""
        measured = [w for w in self._counted(self.windows) if w.clean_iter_s is not None]
        for k in (1, 2):
            if len(measured) < k + 2:
                return
            costs = [w.cost(0.0) for w in measured]
            (m_old, sd_old), (m_new, sd_new) = mean_sd(costs[:-k]), mean_sd(costs[-k:])
            sd_old = max(sd_old, _rms([w.noise_sd for w in measured[:-k]]))
            sd_new = max(sd_new if k > 1 else sd_old, _rms([w.noise_sd for w in measured[-k:]]))
            if clearly_different(m_old, sd_old, len(costs) - k, m_new, sd_new, k + 1, COST_SHIFT):
                del self.windows[:-k]
                self._since_change = min(self._since_change, k - 1)
                return

    # -- decision --------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """True once the tuner has re-tuned (it then owns the interval)."""
        return self._choice is not None

    def adjust(self, choice: IntervalChoice, est: Estimates, elapsed_s: float) -> IntervalChoice:
        if self._choice is None:
            if self._base_steps is not None and choice.steps * self.shorten_ratio > self._base_steps:
                # the profiler's bound rose clearly (a costlier persist, a slower step under it):
                # windows measured before no longer apply; the next one may lengthen on its own
                self.windows.clear()
                self._since_change = min(self._since_change, self.settle - 1)
                self._pending = False
            self._base_steps = choice.steps
        if self._pending and est.iter_time_s and self._since_change >= self.settle:
            self._pending = False
            self._evaluate(choice, est)
        return self._choice if self._choice is not None else choice

    def _evaluate(self, base: IntervalChoice, est: Estimates) -> None:
        # windows too short for clean iterations of their own use the newest measured ones
        fallback_t = self._t_ref if self._t_ref is not None else float(est.iter_time_s)  # type: ignore[arg-type]
        recent = self._counted(self.windows[-min(self._since_change, len(self.windows)):])
        if not recent:
            return
        costs = [w.cost(fallback_t) for w in recent]
        cost, sd = mean_sd(costs)
        sd = max(sd, _rms([w.noise_sd for w in recent]))  # a lucky small spread is not evidence
        # one window (the first after a drift): its mean may lengthen, nothing else
        band = t_quantile(len(costs) - 1) * sd / math.sqrt(len(costs)) if len(costs) > 1 else math.inf
        cost_lo, cost_hi, cost = max(cost - band, 1e-9), max(cost + band, 1e-9), max(cost, 1e-9)
        work = sum(w.steps * w.iter_time(fallback_t) for w in recent)
        self.measured_cost_s = cost
        self.measured_overhead = sum(w.wall_s for w in recent) / work - 1.0
        t = recent[-1].iter_time(fallback_t)
        measured = dataclasses.replace(est, iter_time_s=t, loaded_iter_time_s=None)
        in_force = (self._choice or base).steps
        target = choose_interval(self._aim, measured, cost_s=cost)
        budget = self.config.overhead_budget
        overhead = cost / (in_force * t)
        if overhead > budget * (1 + 1e-6) and target.steps > in_force:
            direction, why = "lengthen", f"overhead {overhead:.2%} > budget {budget:.2%}"
        elif len(costs) < 2:
            return
        elif choose_interval(self._aim, measured, cost_s=cost_lo).steps * self.shorten_ratio > in_force:
            direction, why = "lengthen", f"checkpoints cost more: optimum moved to {target.steps} steps"
        elif choose_interval(self._aim, measured, cost_s=cost_hi).steps < in_force * self.shorten_ratio:
            direction, why = "shorten", f"overhead {overhead:.2%} well under budget {budget:.2%}"
        else:
            return
        new_steps = target.steps
        if self.changes and self.changes[-1].direction != direction:
            # reversing the previous change: wait for more evidence and go only half way (in log)
            if len(recent) < 2 * self.settle:
                return
            new_steps = max(1, round(math.sqrt(in_force * target.steps)))
            why += ", half way back"
        note = f"adaptive: {why}; measured cost {cost:.3g}s/checkpoint over {len(recent)} windows"
        self._choice = IntervalChoice(
            new_steps, new_steps * t, f"adaptive:{target.rule}", target.candidates, cost, note
        )
        step = recent[-1].end_step
        self.changes.append(Change(step, in_force, new_steps, direction, why))
        self._since_change = 0
        log.info("autockpt: interval %d -> %d steps at step %d (%s)", in_force, new_steps, step, why)


def _rms(values: list[float]) -> float:
    return math.sqrt(math.fsum(v * v for v in values) / len(values)) if values else 0.0
