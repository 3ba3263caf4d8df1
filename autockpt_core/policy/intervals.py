"""Closed-form checkpoint intervals. Pure functions of explicit inputs; no state, no clock.

Notation: ``cost_s`` (δ) is the time the training loop loses per checkpoint, ``mtbf_s`` (M)
the mean time between failures, ``iter_time_s`` (t) the time of one optimizer step.
"""

from __future__ import annotations

import math


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young (1974): the compute time between checkpoints, τ = sqrt(2 δ M), in seconds."""
    _check_positive("cost_s", cost_s)
    _check_positive("mtbf_s", mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly (2006, FGCS 22(3), eq. 37): the higher-order optimum compute time between checkpoints.

    τ = sqrt(2δM) · [1 + (1/3)·sqrt(δ/(2M)) + (1/9)·(δ/(2M))] − δ   for δ < 2M,
    τ = M                                                             for δ ≥ 2M.
    """
    _check_positive("cost_s", cost_s)
    _check_positive("mtbf_s", mtbf_s)
    if cost_s >= 2.0 * mtbf_s:
        return float(mtbf_s)
    ratio = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


def budget_interval_steps(stall_s: float, iter_time_s: float, budget: float) -> int:
    """Fewest steps k between checkpoints with stall / (k · iteration time) ≤ budget."""
    _check_positive("iter_time_s", iter_time_s)
    if not 0 < budget < 1:
        raise ValueError(f"budget must be a fraction in (0, 1), got {budget!r}")
    if stall_s <= 0:
        return 1
    # Subtract a tiny epsilon so an exact quotient (e.g. 4.0000000001 from rounding) is not bumped.
    return max(1, math.ceil(stall_s / (budget * iter_time_s) - 1e-9))


def persist_interval_steps(persist_s: float, stall_s: float, iter_time_s: float) -> int:
    """Fewest steps k so a new checkpoint does not start before the previous persist finished.

    k ≥ (persist − stall) / iteration time, and at least 1.
    """
    _check_positive("iter_time_s", iter_time_s)
    remaining = max(0.0, persist_s - max(0.0, stall_s))
    return max(1, math.ceil(remaining / iter_time_s - 1e-9))


def seconds_to_steps(seconds: float, iter_time_s: float) -> int:
    """Whole steps (at least 1) that take about ``seconds`` at ``iter_time_s`` each."""
    _check_positive("iter_time_s", iter_time_s)
    return max(1, round(seconds / iter_time_s))
