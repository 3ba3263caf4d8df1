"""Loss-curve fit: parameter recovery, goodness-of-fit rejections with reasons, online tracker."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autockpt_core.policy.losscurve import LossCurve, LossTracker, fit_loss_curve

K = np.arange(3000, dtype=float)
RNG = np.random.default_rng(0)
NOISE = RNG.standard_normal(K.size)


@settings(max_examples=40, deadline=None)
@given(beta=st.floats(1.0, 8.0), floor=st.floats(0.0, 2.0), scale=st.floats(0.2, 5.0))
def test_noise_free_exponential_is_recovered(beta: float, floor: float, scale: float) -> None:
    true = LossCurve(rate=-beta / K[-1], log_scale=math.log(scale), floor=floor)
    fit = fit_loss_curve(K, true.loss(K))
    assert fit.ok, fit.reason
    assert fit.r2 > 0.999
    assert fit.curve is not None
    assert np.allclose(fit.curve.loss(K), true.loss(K), rtol=5e-3, atol=5e-3 * scale)


CASES = [
    # name, losses, accepted, words in the reason
    ("noisy exponential", (0.3 + 2 * np.exp(-K / 600)) * (1 + 0.1 * NOISE), True, ""),
    ("linear decrease", 2 - K / 3000 + 0.05 * NOISE, True, ""),
    ("negative losses", -1 - 2 * (1 - np.exp(-K / 500)) + 0.05 * NOISE, True, ""),
    ("constant", np.ones(K.size), False, "flat"),
    ("noisy flat", 1 + 0.3 * NOISE, False, "flat"),
    ("rising", 0.5 + K / 3000 + 0.05 * NOISE, False, "rising"),
    ("diverging", np.where(K < 2000, 0.3 + 2 * np.exp(-K / 300), 0.3 + (K - 2000) / 500) + 0.02 * NOISE, False,
     "rising"),
    ("oscillating", 1 + 0.5 * np.sin(K / 100), False, "not exponential-like"),
    ("too few", np.array([1.0, 0.9, 0.8]), False, "not enough"),
]


@pytest.mark.parametrize(("name", "losses", "ok", "words"), CASES, ids=[c[0] for c in CASES])
def test_fit_accepts_or_rejects_with_a_reason(name, losses, ok, words) -> None:
    fit = fit_loss_curve(K[: losses.size], losses)
    assert fit.ok is ok, fit.describe()
    assert (fit.reason == "") is ok
    assert words in fit.reason
    assert fit.describe()  # printable either way


def test_non_finite_losses_are_dropped() -> None:
    y = 0.3 + 2 * np.exp(-K / 1000)
    y[::3] = np.nan
    y[1::7] = np.inf
    fit = fit_loss_curve(K, y)
    assert fit.ok and fit.samples < K.size


def test_tracker_memory_is_bounded_and_refits_rarely() -> None:
    tracker = LossTracker(max_bins=64)
    for k in range(20_000):
        tracker.add(k, 0.3 + 2 * math.exp(-k / 4000))
        tracker.fit()
    steps, losses, counts = tracker.arrays()
    assert len(steps) <= 64 and counts.sum() == 20_000
    assert tracker.fit().ok
    assert tracker.refits <= 35  # geometric growth: about log(20000/32)/log(1.25) = 29 refits
    assert tracker.last_refit_reason == "more samples"  # a perfect curve never looks like drift


def test_tracker_refits_on_drift_and_skips_nan() -> None:
    tracker = LossTracker(refit_growth=10.0)  # growth alone would not refit in this run
    for k in range(2000):
        tracker.add(k, 0.3 + 2 * math.exp(-k / 400))
    first = tracker.fit()
    assert first.ok
    tracker.add(2000, float("nan"))
    for k in range(2001, 4000):  # a learning-rate drop: a new, lower curve
        tracker.add(k, 0.1 + 0.2 * math.exp(-(k - 2000) / 200))
        tracker.fit()
    assert tracker.skipped == 1
    assert tracker.last_refit_reason == "drift from the fitted curve"
    assert tracker.fit() is not first


def test_tracker_restarts_when_steps_go_back() -> None:
    tracker = LossTracker()
    for k in range(100, 200):
        tracker.add(k, 1.0)
    tracker.add(5, 2.0)
    assert tracker.samples == 1
