"""Small-sample statistics for decisions taken on a handful of measurements (no scipy)."""

from __future__ import annotations

import math
from typing import Sequence

# Two-sided 95% quantiles of Student's t for 1..10 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t_quantile(dof: int) -> float:
    """The two-sided 95% Student-t quantile for ``dof`` degrees of freedom (1.96 as dof → ∞)."""
    if dof < 1:
        return math.inf
    if dof <= len(_T975):
        return _T975[dof - 1]
    return 1.96 + 2.4 / dof  # within 1% of the exact quantile for dof > 10


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for fewer than two values)."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def excess_sd(step_sd: float, loaded: int, clean: int) -> float:
    """Standard deviation of ``Σ loaded steps − loaded · mean(clean steps)`` from step-to-step
    noise alone: ``loaded`` steps each with spread ``step_sd``, minus ``loaded`` times the
    clean mean's error, ``step_sd·√(loaded + loaded²/clean)``."""
    return step_sd * math.sqrt(loaded + loaded * loaded / clean)


def clearly_different(
    mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int, rel: float
) -> bool:
    """True if two means differ by more than ``rel`` (relative to ``mean_a``) *and* beyond noise.

    Noise: a Welch-style 95% band, ``t · sqrt(sd_a²/n_a + sd_b²/n_b)`` with the smaller sample's
    degrees of freedom.
    """
    diff = abs(mean_a - mean_b)
    se = math.sqrt(sd_a * sd_a / max(n_a, 1) + sd_b * sd_b / max(n_b, 1))
    return diff > rel * abs(mean_a) and diff > t_quantile(min(n_a, n_b) - 1) * se
