"""Front-loaded checkpoint schedule: short intervals where training progress is worth most.

Value model: progress is worth what it takes off the loss, so the value density at step k is
``w(k) = −L'(k) · S(k)``, with ``L`` the fitted loss curve (:mod:`.losscurve`) and ``S`` an
optional early-stop survival ``exp(−(k − start)/stop_mean_steps)`` (exploratory runs are often
stopped early, so late progress may never be wanted). A failure loses the value made since the
last durable checkpoint.

Minimising checkpoint cost + λ·expected lost value locally gives ``τ(k) = sqrt(2δ/(λ·ŵ(k)))``,
i.e. the uniform Young/Daly interval stretched by ``1/sqrt(ŵ(k))``, with ``ŵ`` the density
normalised over the run's horizon. Two normalisations (``normalise``):

* ``"count"`` (default): ``ŵ = w / mean(sqrt w)²`` — the schedule takes the same number of
  checkpoints over the horizon as the uniform interval, only moved to where they protect more
  value. This is the optimum for a fixed checkpoint cost.
* ``"value"``: ``ŵ = w / mean(w)`` — value measured so that the whole run is worth its compute
  time; the exact minimiser of cost + λ·lost value, taking fewer checkpoints than uniform.

Derivations and results: docs/policy.md. Threading: the adjuster is driven by the policy on the
training thread only.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math

import numpy as np

from .decision import Adjuster, IntervalChoice
from .losscurve import CurveFit, LossCurve, LossTracker
from .profiler import Estimates

log = logging.getLogger("autockpt")

NORMALISATIONS = ("count", "value")
#: Default cap on how far the schedule may stretch or shrink the uniform interval.
MAX_STRETCH = 4.0
#: Without ``total_steps`` the horizon is where the fitted curve made this much of its decrease.
HORIZON_FRACTION = 0.99


@dataclasses.dataclass(frozen=True)
class ValueModel:
    """Value density of training progress over steps ``[start, horizon]``."""

    curve: LossCurve
    horizon: float
    start: float = 0.0
    stop_mean_steps: float | None = None
    grid_points: int = 2049

    def __post_init__(self) -> None:
        if not self.horizon > self.start:
            raise ValueError(f"horizon ({self.horizon}) must be after start ({self.start})")
        if self.stop_mean_steps is not None and not self.stop_mean_steps > 0:
            raise ValueError(f"stop_mean_steps must be positive, got {self.stop_mean_steps}")

    def density(self, k: np.ndarray | float) -> np.ndarray:
        """Raw value density ``w(k) ≥ 0`` (loss decrease per step, times early-stop survival)."""
        k = np.asarray(k, dtype=float)
        w = np.maximum(self.curve.decrease_rate(k), 0.0)
        if self.stop_mean_steps is not None:
            w = w * np.exp(-np.maximum(k - self.start, 0.0) / self.stop_mean_steps)
        return w

    @functools.cached_property
    def _grid(self) -> tuple[np.ndarray, np.ndarray]:
        k = np.linspace(self.start, self.horizon, self.grid_points)
        return k, self.density(k)

    @functools.cached_property
    def _norms(self) -> dict[str, float]:
        _, w = self._grid
        return {"count": float(np.mean(np.sqrt(w)) ** 2), "value": float(np.mean(w))}

    def norm(self, normalise: str = "count") -> float:
        """The normaliser of ``w``: ``mean(sqrt w)²`` ("count") or ``mean(w)`` ("value")."""
        if normalise not in NORMALISATIONS:
            raise ValueError(f"normalise must be one of {NORMALISATIONS}, got {normalise!r}")
        return self._norms[normalise]

    def stretch(self, k: np.ndarray | float, normalise: str = "count") -> np.ndarray:
        """``1/sqrt(ŵ(k))``: the factor applied to the uniform interval at step ``k``."""
        w = self.density(k)
        with np.errstate(divide="ignore"):
            return np.sqrt(self.norm(normalise) / w)

    def cumulative(self, k: np.ndarray | float) -> np.ndarray:
        """Fraction of the horizon's total value made by step ``k`` (0 at start, 1 at horizon)."""
        grid, w = self._grid
        cum = np.concatenate(([0.0], np.cumsum(0.5 * (w[1:] + w[:-1]) * np.diff(grid))))
        total = cum[-1] if cum[-1] > 0 else 1.0
        return np.interp(np.asarray(k, dtype=float), grid, cum / total)


def horizon_for(fit: CurveFit, total_steps: int | None, current_step: float = 0.0) -> float:
    """The run's last step: ``total_steps`` if known, else where the fit made 99% of its decrease."""
    if total_steps is not None:
        return float(max(total_steps, current_step + 1))
    assert fit.curve is not None
    end = fit.curve.step_of_fraction(fit.first_step, HORIZON_FRACTION)
    return float(max(end, fit.last_step, current_step + 1))


def equal_count_steps(model: ValueModel, n: int) -> np.ndarray:
    """``n`` checkpoint steps with equal ``∫sqrt(w)`` between neighbours (optimal for fixed count).

    The continuous optimum of the "count" schedule: ``τ(k) ∝ 1/sqrt(w(k))`` is the same as
    putting an equal share of ``sqrt(w)`` mass in each of the ``n + 1`` gaps.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    grid = np.linspace(model.start, model.horizon, model.grid_points)
    root = np.sqrt(model.density(grid))
    cum = np.concatenate(([0.0], np.cumsum(0.5 * (root[1:] + root[:-1]) * np.diff(grid))))
    if cum[-1] <= 0:
        return np.linspace(model.start, model.horizon, n + 2)[1:-1]
    targets = cum[-1] * np.arange(1, n + 1) / (n + 1)
    return np.interp(targets, cum, grid)


def local_interval(
    model: ValueModel,
    base_steps: float,
    at_step: float,
    lo: float = 1.0,
    hi: float = math.inf,
    max_stretch: float = MAX_STRETCH,
    normalise: str = "count",
) -> tuple[int, float]:
    """The interval (steps) starting at ``at_step`` and the stretch factor used.

    The factor is evaluated at the interval's midpoint (fixed point of
    ``x = base·stretch(at + x/2)``), clipped to ``[1/max_stretch, max_stretch]``; the result is
    clamped to ``[lo, hi]``.
    """
    x, g = float(base_steps), 1.0
    for _ in range(4):
        g = float(np.clip(model.stretch(at_step + x / 2.0, normalise), 1.0 / max_stretch, max_stretch))
        x = base_steps * g
    steps = int(min(max(round(x), lo, 1), hi))
    return max(steps, 1), g


def schedule_steps(
    model: ValueModel,
    base_steps: float,
    lo: float = 1.0,
    hi: float = math.inf,
    max_stretch: float = MAX_STRETCH,
    normalise: str = "count",
) -> list[int]:
    """Every checkpoint step from ``model.start`` to the horizon, as the runtime would place them."""
    steps: list[int] = []
    k = float(model.start)
    while True:
        n, _ = local_interval(model, base_steps, k, lo, hi, max_stretch, normalise)
        k += n
        if k >= model.horizon:
            return steps
        steps.append(int(k))


class FrontLoadedSchedule(Adjuster):
    """Interval adjuster: the uniform (Young/Daly) interval reshaped by the fitted loss curve.

    Feeds every step's loss to a :class:`LossTracker`; while the fit is rejected (too few
    samples, flat, rising or noisy loss) it returns the uniform interval unchanged, with the
    reason in ``IntervalChoice.note`` and :attr:`fallback_reason`. Never goes denser than the
    budget, persist or min_interval bounds, nor longer than max_interval.
    """

    def __init__(
        self,
        total_steps: int | None = None,
        *,
        max_stretch: float = MAX_STRETCH,
        normalise: str = "count",
        stop_mean_steps: float | None = None,
        tracker: LossTracker | None = None,
    ) -> None:
        if normalise not in NORMALISATIONS:
            raise ValueError(f"normalise must be one of {NORMALISATIONS}, got {normalise!r}")
        if not max_stretch >= 1:
            raise ValueError(f"max_stretch must be >= 1, got {max_stretch}")
        self.total_steps = total_steps
        self.max_stretch = max_stretch
        self.normalise = normalise
        self.stop_mean_steps = stop_mean_steps
        self.tracker = tracker if tracker is not None else LossTracker()
        self.fallback_reason = "no loss seen yet"
        self._last_ckpt = 0
        self._step = 0
        self._key: tuple[object, ...] | None = None
        self._local: tuple[int, float] = (1, 1.0)
        self._model: ValueModel | None = None
        self._model_fit: CurveFit | None = None

    @property
    def active(self) -> bool:
        """True while the fitted curve shapes the interval (else: uniform, see fallback_reason)."""
        return not self.fallback_reason

    def observe_start(self, step: int, now: float) -> None:
        self._last_ckpt = self._step = step

    def observe_step(self, step: int, now: float, persist_busy: bool, loss: float | None) -> None:
        self._step = step
        if loss is not None:
            self.tracker.add(step, float(loss))

    def observe_checkpoint(self, step: int, now: float) -> None:
        self._last_ckpt = step

    def adjust(self, choice: IntervalChoice, est: Estimates, elapsed_s: float) -> IntervalChoice:
        fit = self.tracker.fit()
        reason = fit.reason if not fit.ok else ""
        if not reason and "daly" not in choice.candidates:
            reason = "no MTBF, so no failure rate to weigh progress against"
        if reason:
            self._set_fallback(reason)
            return dataclasses.replace(choice, note=_join(choice.note, f"front_loaded off ({reason}); uniform"))
        assert fit.curve is not None
        self._set_fallback("")
        cands = choice.candidates
        lo = max([cands[r] for r in ("budget", "persist", "min_interval") if r in cands] or [1])
        hi = cands.get("max_interval", math.inf)
        base = cands["daly"]
        key = (id(fit), self._last_ckpt, base, lo, hi)
        if key != self._key:  # the interval only changes at a checkpoint, a refit or new bounds
            if self._model is None or self._model_fit is not fit:
                horizon = horizon_for(fit, self.total_steps, self._last_ckpt)
                self._model = ValueModel(fit.curve, horizon, stop_mean_steps=self.stop_mean_steps)
                self._model_fit = fit
            self._key = key
            self._local = local_interval(self._model, base, self._last_ckpt, lo, hi, self.max_stretch, self.normalise)
        steps, g = self._local
        rule = "front_loaded"
        if steps == lo and base * g < lo:
            rule = next(r for r in ("budget", "persist", "min_interval") if cands.get(r) == lo)
        elif steps == hi and base * g > hi:
            rule = "max_interval"
        per_step = choice.seconds / choice.steps if choice.steps else (est.iter_time_s or 0.0)
        note = f"front_loaded: daly {base} steps x{g:.2f} at step {self._last_ckpt} ({fit.curve.describe()})"
        return IntervalChoice(
            steps, steps * per_step, rule, {**cands, "front_loaded": steps}, choice.cost_s, _join(choice.note, note)
        )

    def _set_fallback(self, reason: str) -> None:
        if reason != self.fallback_reason:
            if reason:
                log.info("autockpt: front-loaded schedule off, using the uniform interval: %s", reason)
            else:
                log.info("autockpt: front-loaded schedule on (%s)", self.tracker.fit().describe())
        self.fallback_reason = reason


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)

