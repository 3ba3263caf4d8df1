"""The loss-curve model behind the front-loaded schedule, its fit and an online tracker.

Model (per optimizer step k): ``L(k) = c + exp(b + a·k)`` with ``a < 0``: an exponential decay
towards a floor ``c``. With ``c = 0`` it is the ``exp(a·t + b)`` model of COCI; the floor lets
it fit curves that level off above zero (cross-entropy rarely goes to 0). The fit profiles
the floor: for each candidate ``c`` below the smallest observed loss, ``log(L − c)`` is fitted
by weighted least squares on ``k``; the ``c`` with the smallest squared error *in loss space*
wins. Goodness-of-fit checks reject curves the schedule should not trust (too few samples,
rising, flat, noisy); a rejected fit carries the reason, for logging.

:class:`LossTracker` keeps binned running means of ``(step, loss)`` (bounded memory: bins
double in width when full), refits when the data grew by a quarter, and refits at once when
consecutive new bins drift away from the fitted curve. One thread (the training thread) calls
``add``/``fit``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

#: Minimum number of bins and of raw samples before a fit is attempted.
MIN_BINS = 8
MIN_SAMPLES = 32
#: Fits with R² below this (loss space, on ``R2_BINS`` coarse bins) are rejected.
MIN_R2 = 0.6
GOLDEN = (1 + math.sqrt(5)) / 2
#: Coarse bins the R² check is computed on (averages out minibatch noise, keeps the shape).
R2_BINS = 16
#: Fitted decrease over the observed steps, relative to the loss scale, below which it is "flat".
MIN_DECREASE = 0.02


@dataclasses.dataclass(frozen=True)
class LossCurve:
    """``L(k) = floor + exp(log_scale + rate·k)``; ``rate < 0`` for a decaying loss."""

    rate: float
    log_scale: float
    floor: float

    def loss(self, k: np.ndarray | float) -> np.ndarray:
        return self.floor + np.exp(self.log_scale + self.rate * np.asarray(k, dtype=float))

    def decrease_rate(self, k: np.ndarray | float) -> np.ndarray:
        """``−dL/dk``: loss decrease per step (positive while the loss falls)."""
        return -self.rate * np.exp(self.log_scale + self.rate * np.asarray(k, dtype=float))

    def step_of_fraction(self, k0: float, fraction: float = 0.99) -> float:
        """Step where the curve has made ``fraction`` of its remaining decrease after ``k0``."""
        if self.rate >= 0:
            return math.inf
        return k0 + math.log(1.0 - fraction) / self.rate

    def describe(self) -> str:
        return f"L(k) = {self.floor:.4g} + exp({self.log_scale:.4g} {self.rate:+.4g}·k)"


@dataclasses.dataclass(frozen=True)
class CurveFit:
    """Result of :func:`fit_loss_curve`. ``ok`` False means: do not trust ``curve``; ``reason`` says why."""

    curve: LossCurve | None
    ok: bool
    reason: str
    r2: float = float("nan")
    samples: int = 0
    first_step: float = 0.0
    last_step: float = 0.0
    relative_decrease: float = 0.0
    residual_std: float = float("nan")

    def describe(self) -> str:
        if self.curve is None:
            return f"no fit ({self.reason})"
        status = "accepted" if self.ok else f"rejected: {self.reason}"
        return (
            f"{self.curve.describe()} over steps {self.first_step:.0f}-{self.last_step:.0f} "
            f"(R²={self.r2:.3f}, decrease {self.relative_decrease:.1%}, n={self.samples}) {status}"
        )


def bin_means(
    steps: np.ndarray, losses: np.ndarray, max_bins: int = 128
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Average ``(step, loss)`` pairs into at most ``max_bins`` equal-width step bins.

    Returns (mean step, mean loss, count) of the non-empty bins.
    """
    steps = np.asarray(steps, dtype=float)
    losses = np.asarray(losses, dtype=float)
    if steps.size == 0:
        return steps, losses, np.zeros(0)
    lo, hi = float(steps.min()), float(steps.max())
    width = max((hi - lo) / max_bins, 1e-12)
    idx = np.minimum(((steps - lo) / width).astype(np.int64), max_bins - 1)
    count = np.bincount(idx, minlength=max_bins).astype(float)
    sk = np.bincount(idx, weights=steps, minlength=max_bins)
    sl = np.bincount(idx, weights=losses, minlength=max_bins)
    keep = count > 0
    return sk[keep] / count[keep], sl[keep] / count[keep], count[keep]


def fit_loss_curve(
    steps: Sequence[float] | np.ndarray,
    losses: Sequence[float] | np.ndarray,
    weights: Sequence[float] | np.ndarray | None = None,
    *,
    max_bins: int = 128,
    min_r2: float = MIN_R2,
    min_decrease: float = MIN_DECREASE,
) -> CurveFit:
    """Fit ``L(k) = c + exp(b + a·k)`` to raw or binned samples and check the fit.

    ``weights`` are sample counts when the inputs are already bin means (then no re-binning
    below ``max_bins``). Non-finite losses are dropped. Never raises on bad data: the result's
    ``ok``/``reason`` say whether the curve may be used.
    """
    k = np.asarray(steps, dtype=float).ravel()
    y = np.asarray(losses, dtype=float).ravel()
    if k.shape != y.shape:
        raise ValueError(f"steps and losses differ in length ({k.size} vs {y.size})")
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float).ravel()
    good = np.isfinite(k) & np.isfinite(y) & np.isfinite(w) & (w > 0)
    k, y, w = k[good], y[good], w[good]
    samples = int(round(w.sum()))
    if samples < MIN_SAMPLES:
        return CurveFit(None, False, f"not enough loss samples yet ({samples} < {MIN_SAMPLES})", samples=samples)
    if k.size > max_bins:
        if weights is None:
            k, y, w = bin_means(k, y, max_bins)
        else:
            k, y, w = _rebin_weighted(k, y, w, max_bins)
    if k.size < MIN_BINS:
        return CurveFit(None, False, f"loss samples span too few steps ({k.size} bins < {MIN_BINS})", samples=samples)
    return _fit_binned(k, y, w, samples, min_r2, min_decrease)


def _rebin_weighted(
    k: np.ndarray, y: np.ndarray, w: np.ndarray, max_bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo, hi = float(k.min()), float(k.max())
    width = max((hi - lo) / max_bins, 1e-12)
    idx = np.minimum(((k - lo) / width).astype(np.int64), max_bins - 1)
    cw = np.bincount(idx, weights=w, minlength=max_bins)
    sk = np.bincount(idx, weights=w * k, minlength=max_bins)
    sy = np.bincount(idx, weights=w * y, minlength=max_bins)
    keep = cw > 0
    return sk[keep] / cw[keep], sy[keep] / cw[keep], cw[keep]


def _fit_binned(
    k: np.ndarray, y: np.ndarray, w: np.ndarray, samples: int, min_r2: float, min_decrease: float
) -> CurveFit:
    k0, span = float(k.min()), float(k.max() - k.min())
    if span <= 0:
        return CurveFit(None, False, "all loss samples are at one step", samples=samples)
    x = (k - k0) / span
    y_min, y_rng = float(y.min()), float(y.max() - y.min())
    scale = max(abs(float(np.average(y, weights=w))), y_rng, 1e-12)
    if y_rng <= 1e-12 * scale:
        return CurveFit(None, False, "loss curve is flat (constant loss)", samples=samples)
    sw = float(w.sum())

    def fit_at(log_gap: float) -> tuple[float, float, float, float]:
        """(sse, floor, slope, intercept) of the log-linear fit with floor = min(y) − exp(log_gap)."""
        floor = y_min - math.exp(log_gap)
        z = np.log(y - floor)
        # weights (y − floor)²: a log residual times (y − floor) is a loss residual, so this
        # approximates least squares in loss space and keeps the tail near the floor from dominating
        lw = w * (y - floor) ** 2
        slw = float(lw.sum())
        xm, zm = float(np.dot(lw, x) / slw), float(np.dot(lw, z) / slw)
        sxx = float(np.dot(lw, (x - xm) ** 2))
        slope = float(np.dot(lw, (x - xm) * (z - zm)) / sxx) if sxx > 0 else 0.0
        intercept = zm - slope * xm
        sse = float(np.dot(w, (y - floor - np.exp(intercept + slope * x)) ** 2))
        return sse, floor, slope, intercept

    grid = list(np.linspace(math.log(1e-6 * y_rng), math.log(10.0 * y_rng), 64))
    if y_min > 0:
        grid.append(math.log(y_min))  # floor exactly 0: the plain exp(a·t + b) model
    grid.sort()
    fits = [fit_at(g) for g in grid]
    i = min(range(len(fits)), key=lambda j: fits[j][0])
    best = fits[i]
    if 0 < i < len(grid) - 1:  # golden-section refinement of the floor between the neighbours
        a, b = grid[i - 1], grid[i + 1]
        for _ in range(30):
            c, d = b - (b - a) / GOLDEN, a + (b - a) / GOLDEN
            if fit_at(c)[0] < fit_at(d)[0]:
                b = d
            else:
                a = c
        refined = fit_at((a + b) / 2)
        best = min(best, refined, key=lambda f: f[0])
    sse, floor, slope, intercept = best
    rate = slope / span
    curve = LossCurve(rate=rate, log_scale=intercept - rate * k0, floor=floor)
    r2 = _coarse_r2(curve, k, y, w)
    pred_first, pred_last = float(curve.loss(k.min())), float(curve.loss(k.max()))
    decrease = (pred_first - pred_last) / max(abs(pred_first), abs(pred_last), 1e-12)
    resid_std = math.sqrt(sse / sw)

    def result(reason: str) -> CurveFit:
        return CurveFit(curve, not reason, reason, r2, samples, float(k.min()), float(k.max()), decrease, resid_std)

    if abs(decrease) < min_decrease:
        return result(f"loss curve is flat (change {decrease:.1%}, below {min_decrease:.0%})")
    if rate >= 0 or decrease < 0:
        return result(f"loss is rising (fitted rate {rate:+.3g}/step)")
    rising = _recent_rise(x, y, w)
    if rising:
        return result(rising)
    if r2 < min_r2:
        return result(f"loss too noisy or not exponential-like (R²={r2:.2f} < {min_r2:.2f})")
    return result("")


def _coarse_r2(curve: LossCurve, k: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """R² of the fit on ``R2_BINS`` coarse bins: judges the shape, not per-step minibatch noise."""
    ck, cy, cw = _rebin_weighted(k, y, w, R2_BINS) if k.size > R2_BINS else (k, y, w)
    mean = float(np.dot(cw, cy) / cw.sum())
    sst = float(np.dot(cw, (cy - mean) ** 2))
    sse = float(np.dot(cw, (cy - curve.loss(ck)) ** 2))
    return 1.0 - sse / sst if sst > 0 else 0.0


def _recent_rise(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> str:
    """A reason if the last quarter of the curve rises significantly (divergence), else ''."""
    tail = x >= 0.75
    if int(tail.sum()) < 4:
        return ""
    xt, yt, wt = x[tail], y[tail], w[tail]
    sw = float(wt.sum())
    xm, ym = float(np.dot(wt, xt) / sw), float(np.dot(wt, yt) / sw)
    sxx = float(np.dot(wt, (xt - xm) ** 2))
    if sxx <= 0:
        return ""
    slope = float(np.dot(wt, (xt - xm) * (yt - ym)) / sxx)
    resid = yt - ym - slope * (xt - xm)
    dof = max(int(tail.sum()) - 2, 1)
    se = math.sqrt(float(np.dot(wt, resid**2)) / dof / sxx) if sxx > 0 else math.inf
    if slope > 0 and se > 0 and slope / se > 3.0:
        return f"loss is rising over the most recent quarter of the samples (t={slope / se:.1f})"
    return ""


class LossTracker:
    """Online, bounded-memory record of the loss curve with refit on growth or drift.

    ``add(step, loss)`` after every step (non-finite losses are counted and skipped);
    ``fit()`` returns the current :class:`CurveFit`, refitting when the samples grew by
    ``refit_growth`` since the last fit or when ``drift_bins`` consecutive closed bins lie more
    than ``drift_sigmas`` residual standard deviations from the fitted curve.
    """

    def __init__(
        self,
        max_bins: int = 128,
        refit_growth: float = 0.25,
        drift_sigmas: float = 4.0,
        drift_bins: int = 3,
    ) -> None:
        if max_bins < 2 * MIN_BINS:
            raise ValueError(f"max_bins must be >= {2 * MIN_BINS}, got {max_bins}")
        self.max_bins = max_bins
        self.refit_growth = refit_growth
        self.drift_sigmas = drift_sigmas
        self.drift_bins = drift_bins
        self.refits = 0
        self.skipped = 0
        self.last_refit_reason = ""
        self._reset()

    def _reset(self) -> None:
        self._origin: int | None = None
        self._width = 1
        self._sk: list[float] = []
        self._sl: list[float] = []
        self._n: list[int] = []
        self._samples = 0
        self._fit = CurveFit(None, False, f"not enough loss samples yet (0 < {MIN_SAMPLES})")
        self._fit_samples = 0
        self._drifting = 0
        self._drift_due = False

    @property
    def samples(self) -> int:
        return self._samples

    def add(self, step: int, loss: float) -> None:
        """Record the loss after ``step``. A step before the first recorded one restarts the record."""
        if not math.isfinite(loss):
            self.skipped += 1
            return
        if self._origin is None or step < self._origin:
            self._reset()
            self._origin = step
        idx = (step - self._origin) // self._width
        while idx >= self.max_bins:
            self._merge()
            idx = (step - self._origin) // self._width
        while len(self._n) <= idx:
            if self._n:
                self._check_drift(len(self._n) - 1)
            self._sk.append(0.0)
            self._sl.append(0.0)
            self._n.append(0)
        self._sk[idx] += step
        self._sl[idx] += loss
        self._n[idx] += 1
        self._samples += 1

    def _merge(self) -> None:
        self._width *= 2
        sk, sl, n = [0.0] * (self.max_bins // 2 + 1), [0.0] * (self.max_bins // 2 + 1), [0] * (self.max_bins // 2 + 1)
        for i, (a, b, c) in enumerate(zip(self._sk, self._sl, self._n)):
            sk[i // 2] += a
            sl[i // 2] += b
            n[i // 2] += c
        last = (len(self._n) - 1) // 2 + 1 if self._n else 0
        self._sk, self._sl, self._n = sk[:last], sl[:last], n[:last]

    def _check_drift(self, i: int) -> None:
        fit = self._fit
        if not fit.ok or fit.curve is None or self._n[i] == 0 or not fit.residual_std > 0:
            return
        mean_k, mean_l = self._sk[i] / self._n[i], self._sl[i] / self._n[i]
        if abs(mean_l - float(fit.curve.loss(mean_k))) > self.drift_sigmas * fit.residual_std:
            self._drifting += 1
            if self._drifting >= self.drift_bins:
                self._drift_due = True
        else:
            self._drifting = 0

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean step, mean loss, count) of the non-empty bins."""
        n = np.asarray(self._n, dtype=float)
        keep = n > 0
        return (
            np.asarray(self._sk)[keep] / n[keep],
            np.asarray(self._sl)[keep] / n[keep],
            n[keep],
        )

    def fit(self) -> CurveFit:
        """The current fit, refitted first when due (growth or drift)."""
        grown = self._samples >= max(MIN_SAMPLES, (1.0 + self.refit_growth) * self._fit_samples)
        if self._drift_due or (grown and self._samples > self._fit_samples):
            self.last_refit_reason = "drift from the fitted curve" if self._drift_due else "more samples"
            k, y, w = self.arrays()
            self._fit = fit_loss_curve(k, y, w, max_bins=self.max_bins)
            self._fit_samples = self._samples
            self._drifting = 0
            self._drift_due = False
            self.refits += 1
        return self._fit
