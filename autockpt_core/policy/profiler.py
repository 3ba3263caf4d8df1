"""Online, robust estimates of what checkpointing costs.

The training thread feeds raw measurements; estimates are medians over a sliding window, so a
single slow step (GC pause, page-cache flush) does not move them. The first ``warmup_steps``
iterations are ignored (compilation, allocator and cache warm-up).

Threading: ``record_iteration``, ``record_hook`` and ``record_stall`` are called from the
training thread, ``record_persist`` from the writer thread; a lock keeps the windows consistent.
"""

from __future__ import annotations

import dataclasses
import math
import threading

from .giant_steps import GIANT_FACTOR, GiantRates, is_giant
from .sorted_window import SortedWindow
from .stats import t_quantile


@dataclasses.dataclass(frozen=True)
class Estimates:
    """A consistent reading of the profiler's estimates (seconds and bytes).

    ``None`` means "not measured yet". ``loaded_iter_time_s`` is the mean duration of the
    iterations that ran while a checkpoint was being snapshotted or persisted (their own stall
    excluded; one over 5x the clean median left out while such giants are not clearly the
    checkpoints', capped at that once they are, so one stall cannot dominate);
    compared with ``iter_time_s`` it gives the slowdown background work causes.
    ``recent_iter_time_s`` is the median of the last :data:`RECENT` clean iterations: the
    reference for the steps right after a checkpoint (a machine whose speed drifts, or a
    process that trains faster once it has written a checkpoint, moves the window median
    too slowly for that). ``iter_sd_s`` is the spread of the clean iterations in the window, a
    robust standard deviation (1.4826 × the median absolute deviation; None below
    :data:`SPREAD_SAMPLES`): how much two identical steps differ on this machine, the noise
    against which a slowdown measured over a few steps is judged. ``hook_s``: the median time
    per step of autockpt's own work in its hooks (every step pays it; reported beside the
    budget, not charged to it; None until measured).
    ``loaded_iterations`` and ``loaded_sd_s``: how many loaded iterations
    ``loaded_iter_time_s`` averages (in the window) and their spread, from which
    :attr:`checkpoint_cost_s` bounds the slowdown from above.
    """

    iter_time_s: float | None = None
    stall_s: float | None = None
    persist_s: float | None = None
    checkpoint_bytes: int | None = None
    loaded_iter_time_s: float | None = None
    recent_iter_time_s: float | None = None
    iter_sd_s: float | None = None
    loaded_iterations: int = 0
    loaded_sd_s: float | None = None
    iterations_seen: int = 0
    checkpoints_seen: int = 0
    hook_s: float | None = None

    @property
    def ready(self) -> bool:
        """True once iteration time, stall and persist time have all been measured."""
        return None not in (self.iter_time_s, self.stall_s, self.persist_s)

    @property
    def background_slowdown(self) -> float | None:
        """Relative slowdown of iterations overlapping checkpoint work, e.g. 0.03 = 3%."""
        if self.iter_time_s is None or self.loaded_iter_time_s is None or self.iter_time_s <= 0:
            return None
        return max(0.0, self.loaded_iter_time_s / self.iter_time_s - 1.0)

    @property
    def background_cost_s(self) -> float:
        """Training time lost per checkpoint to the background persist, beyond the stall.

        During a persist of ``persist_s`` seconds iterations run ``1 + s`` times slower, so
        about ``persist_s / (t·(1 + s))`` iterations each lose ``t·s``: ``persist_s·s/(1 + s)``.
        0 while the slowdown or the persist time is unknown.
        """
        slow = self.background_slowdown
        if not slow or self.persist_s is None:
            return 0.0
        return self.persist_s * slow / (1.0 + slow)

    @property
    def background_cost_bound_s(self) -> float:
        """:attr:`background_cost_s` bounded from above, for choosing an interval before the
        adaptive tuner has measured whole checkpoint windows (approach the budget from below).

        With at least :data:`MIN_LOADED` loaded iterations: the slowdown's upper 95% bound
        (Student-t over their spread) in place of its mean. With fewer, the whole persist
        time, as if training stood still while it ran (a persist that overlaps steps costs
        them at most its own duration). 0 while the persist time is unknown.
        """
        if self.persist_s is None:
            return 0.0
        t = self.iter_time_s
        n = self.loaded_iterations
        if self.loaded_iter_time_s is None or t is None or t <= 0 or n < MIN_LOADED:
            return self.persist_s
        upper = self.loaded_iter_time_s + t_quantile(n - 1) * (self.loaded_sd_s or 0.0) / math.sqrt(n)
        slow = max(0.0, upper / t - 1.0)
        return self.persist_s * slow / (1.0 + slow)

    @property
    def checkpoint_cost_s(self) -> float | None:
        """Training time one checkpoint costs, bounded from above: the stall plus
        :attr:`background_cost_bound_s` (what the budget bound uses)."""
        if self.stall_s is None:
            return None
        return self.stall_s + self.background_cost_bound_s

    @property
    def expected_cost_s(self) -> float | None:
        """Training time one checkpoint costs, best estimate: the stall plus
        :attr:`background_cost_s` (what Young/Daly's optimum uses)."""
        if self.stall_s is None:
            return None
        return self.stall_s + self.background_cost_s


#: Loaded iterations needed before their measured slowdown replaces the whole persist time
#: in :attr:`Estimates.checkpoint_cost_s`.
MIN_LOADED = 3
#: Fresh clean iterations needed before a re-measured iteration time is trusted again.
REFRESH_SAMPLES = 3
#: A per-step decision (:meth:`Profiler.step_reading`) reuses a ready reading until more than
#: this many new samples (iteration and hook times: two per step) arrived since it was taken.
#: Recomputing the window statistics at every step was a third of the step hook's cost, and a
#: median over a 50-step window moves little in 8 steps. A stall, a persist time or a changed
#: window (re-measuring) always gives a fresh reading.
STEP_READING_SAMPLES = 16
#: Clean iterations in ``Estimates.recent_iter_time_s``.
RECENT = 5
#: Clean iterations needed before ``Estimates.iter_sd_s`` is given.
SPREAD_SAMPLES = 5
#: Robust standard deviation = this × the median absolute deviation (normal noise).
MAD_TO_SD = 1.4826


class Profiler:
    """Sliding-window medians of iteration time, stall, persist time and checkpoint bytes."""

    def __init__(self, warmup_steps: int = 5, window: int = 50) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._warmup = warmup_steps
        self._lock = threading.Lock()
        self._iter = SortedWindow(window)
        self._recent = SortedWindow(RECENT)
        self._loaded_iter = SortedWindow(window)
        self._stall = SortedWindow(window)
        self._persist = SortedWindow(window)
        self._bytes = SortedWindow(window)
        self._hook = SortedWindow(window)
        self._estimates: Estimates | None = None  # the newest reading, until a stall, persist or reset
        self._samples_since = 0  # iteration and hook samples recorded since that reading
        self._iterations = 0
        self._checkpoints = 0
        self._window = window
        self._since_clean = 0  # loaded iterations recorded since the last clean one
        self._refreshing = False
        self._last_kind: str | None = None  # where the newest iteration went: "clean", "loaded" or None
        self._last_giant = False  # whether the newest iteration was a giant
        self.giant_rates = GiantRates()  # giant iterations among clean and loaded ones (under the lock)

    def record_iteration(self, seconds: float, loaded: bool = False) -> None:
        """One iteration's duration, its own checkpoint stall already subtracted.

        ``loaded`` marks iterations that overlapped a snapshot copy or a persist.
        """
        with self._lock:
            self._samples_since += 1
            self._iterations += 1
            self._last_kind = None
            if self._iterations <= self._warmup or seconds < 0:
                return
            self._last_kind = "loaded" if loaded else "clean"
            giant = is_giant(seconds, self._iter.median())
            self.giant_rates.count(loaded, giant)
            self._last_giant = giant
            if loaded:
                self._loaded_iter.append(seconds)
                self._since_clean += 1
                if self._since_clean >= self._window and not self._refreshing:
                    # A whole window without a clean iteration: the clean estimate is stale
                    # (e.g. a too-high early estimate gave a 1-step interval, so every step
                    # overlaps a persist and nothing could correct it). Drop it; the estimate
                    # is None until REFRESH_SAMPLES new clean iterations are measured, and the
                    # policy pauses checkpoints for those few steps.
                    self._iter.clear()
                    self._refreshing = True
                    self._changed()
            else:
                self._iter.append(seconds)
                self._recent.append(seconds)
                self._since_clean = 0
                if self._refreshing and len(self._iter) >= REFRESH_SAMPLES:
                    self._refreshing = False
                    self._changed()

    def record_hook(self, seconds: float, steps: int = 1) -> None:
        """autockpt's own work in the hooks of the ``steps`` iterations just recorded took
        ``seconds`` in all: their mean is one sample (not kept during warm-up)."""
        with self._lock:
            if self._iterations <= self._warmup or steps < 1:
                return
            self._samples_since += 1
            self._hook.append(max(0.0, seconds) / steps)

    def revise_last_iteration(self, seconds: float) -> None:
        """Replace the newest iteration's duration (the job's, once every rank's is known).

        A no-op when that iteration was not kept (warm-up, negative).
        """
        with self._lock:
            self._samples_since += 1
            if self._last_kind is not None:
                loaded = self._last_kind == "loaded"
                self.giant_rates.count(loaded, self._last_giant, -1)
                self._last_giant = is_giant(seconds, self._iter.median())
                self.giant_rates.count(loaded, self._last_giant)
            if self._last_kind == "clean" and self._iter and self._recent:
                self._iter.replace_last(max(0.0, seconds))
                self._recent.replace_last(max(0.0, seconds))
            elif self._last_kind == "loaded" and self._loaded_iter:
                self._loaded_iter.replace_last(max(0.0, seconds))

    def revise_last_stall(self, seconds: float) -> float:
        """Raise the newest stall to ``seconds`` if longer (the slowest rank's); returns the increase."""
        with self._lock:
            if not self._stall or seconds <= self._stall.last:
                return 0.0
            self._changed()
            increase = seconds - self._stall.last
            self._stall.replace_last(seconds)
            return increase

    def record_stall(self, seconds: float, nbytes: int) -> None:
        """Time the training thread was blocked by one checkpoint, and its size."""
        with self._lock:
            self._changed()
            self._checkpoints += 1
            self._stall.append(max(0.0, seconds))
            self._bytes.append(int(nbytes))

    def record_persist(self, seconds: float) -> None:
        """Wall time of one background persist (serialize, write, fsync, rename, manifest)."""
        with self._lock:
            self._changed()
            self._persist.append(max(0.0, seconds))

    def _changed(self) -> None:
        """A stall, persist or size arrived, or a window was reset: the kept reading is stale
        for every caller (call with the lock held)."""
        self._estimates = None

    def estimates(self) -> Estimates:
        """Current medians; safe to call from any thread. The same object until the next record."""
        with self._lock:
            return self._reading(0)

    def step_reading(self) -> Estimates:
        """The reading a per-step decision uses: like :meth:`estimates`, but a ready reading is
        kept until more than :data:`STEP_READING_SAMPLES` iteration and hook samples arrived
        since it was taken (a stall, a persist time or a re-measured window renews it at once)."""
        with self._lock:
            kept = self._estimates
            return self._reading(STEP_READING_SAMPLES if kept is not None and kept.ready else 0)

    def _reading(self, max_age: int) -> Estimates:
        """The kept reading if at most ``max_age`` samples arrived since, else a new one (lock held)."""
        if self._estimates is not None and self._samples_since <= max_age:
            return self._estimates
        clean = self._iteration_estimate()
        loaded_mean, loaded_sd, loaded_n = _loaded_figures(self._loaded_iter, clean,
                                                           self.giant_rates.checkpoint_caused())
        checkpoint_bytes = self._bytes.median()
        self._estimates = Estimates(
            iter_time_s=clean,
            stall_s=_median(self._stall),
            persist_s=_median(self._persist),
            checkpoint_bytes=int(checkpoint_bytes) if checkpoint_bytes is not None else None,
            loaded_iter_time_s=loaded_mean,
            loaded_iterations=loaded_n,
            loaded_sd_s=loaded_sd,
            recent_iter_time_s=_median(self._recent),
            iter_sd_s=_robust_sd(self._iter),
            iterations_seen=self._iterations,
            checkpoints_seen=self._checkpoints,
            hook_s=_median(self._hook),
        )
        self._samples_since = 0
        return self._estimates

    def _iteration_estimate(self) -> float | None:
        """Median of the clean iterations, or None while a stale window is being re-measured."""
        if self._refreshing and len(self._iter) < REFRESH_SAMPLES:
            return None
        return _median(self._iter)

    @property
    def in_warmup(self) -> bool:
        with self._lock:
            return self._iterations <= self._warmup


#: Loaded iterations count at most this many clean iteration times in the slowdown mean.
OUTLIER_CAP = GIANT_FACTOR


def _loaded_figures(values: SortedWindow, clean: float | None,
                    giants_caused: bool) -> tuple[float | None, float | None, int]:
    """Mean, sample standard deviation and count of the loaded iterations ``values`` (mean None
    when none counts, standard deviation None below two).

    The mean (not the median) keeps the whole cost of a persist that slows a few iterations a
    lot. An iteration over OUTLIER_CAP × the clean median (a giant, :mod:`.giant_steps`) is
    left out while giants are not clearly the checkpoints' (a machine's stall that happened to
    fall during a persist); once they are, it counts capped at that, so that one page-cache
    flush cannot turn into a 1000% slowdown.
    """
    cap = OUTLIER_CAP * clean if clean is not None and clean > 0 else math.inf
    if giants_caused:
        figures = values.capped_mean_sd(cap)
        if figures is None:
            return None, None, 0
        mean, sd = figures
        n = len(values)
    else:
        below = values.mean_sd_below(cap)
        if below is None:
            return None, None, 0
        mean, sd, n = below
    return mean, (sd if n > 1 else None), n


def _robust_sd(values: SortedWindow) -> float | None:
    """1.4826 × the median absolute deviation of ``values`` (None below SPREAD_SAMPLES)."""
    if len(values) < SPREAD_SAMPLES:
        return None
    return MAD_TO_SD * float(values.median_abs_deviation())  # type: ignore[arg-type]


def _median(values: SortedWindow) -> float | None:
    median = values.median()
    return float(median) if median is not None else None
