import math

import pytest

from autockpt_core import (
    budget_interval_steps,
    daly_interval,
    persist_interval_steps,
    seconds_to_steps,
    young_interval,
)

MIN = 60.0
HOUR = 3600.0


@pytest.mark.parametrize(
    ("cost", "mtbf", "expected"),
    [
        (5 * MIN, 24 * HOUR, 120 * MIN),  # sqrt(2*5*1440) = 120 min
        (5 * MIN, 6 * HOUR, 60 * MIN),
        (2.0, 100.0, 20.0),
        (0.5, 1.0, 1.0),
    ],
)
def test_young_hand_computed(cost, mtbf, expected) -> None:
    assert young_interval(cost, mtbf) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mtbf", "expected_minutes", "tol"),
    # Daly's own worked values for delta = 5 min (FGCS 2006): 117 min, 57 min, 9.1 min.
    [(24 * HOUR, 117.0, 0.5), (6 * HOUR, 57.0, 0.5), (15 * MIN, 9.1, 0.05)],
)
def test_daly_worked_values(mtbf, expected_minutes, tol) -> None:
    assert daly_interval(5 * MIN, mtbf) / MIN == pytest.approx(expected_minutes, abs=tol)


def test_daly_exact_formula_and_large_cost_branch() -> None:
    # delta=2, M=100: sqrt(400)*(1 + sqrt(0.01)/3 + 0.01/9) - 2
    assert daly_interval(2.0, 100.0) == pytest.approx(20 * (1 + 0.1 / 3 + 0.01 / 9) - 2)
    assert daly_interval(300.0, 100.0) == 100.0  # delta >= 2M -> tau = M
    assert daly_interval(200.0, 100.0) == 100.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_interval_functions_reject_bad_inputs(bad) -> None:
    with pytest.raises(ValueError):
        young_interval(bad, 10.0)
    with pytest.raises(ValueError):
        daly_interval(1.0, bad)


@pytest.mark.parametrize(
    ("stall", "iter_time", "budget", "steps"),
    [
        (0.120, 0.350, 0.02, 18),  # 0.12 / (0.02*0.35) = 17.14 -> 18
        (0.070, 0.350, 0.02, 10),  # exactly 10
        (0.0, 0.1, 0.02, 1),
        (1.0, 0.1, 0.5, 20),
        (0.001, 1.0, 0.02, 1),
    ],
)
def test_budget_interval(stall, iter_time, budget, steps) -> None:
    k = budget_interval_steps(stall, iter_time, budget)
    assert k == steps
    assert stall / (k * iter_time) <= budget + 1e-12
    if k > 1:
        assert stall / ((k - 1) * iter_time) > budget


@pytest.mark.parametrize(
    ("persist", "stall", "iter_time", "steps"),
    [(2.0, 0.12, 0.35, 6), (0.1, 0.12, 0.35, 1), (3.5, 0.0, 0.35, 10)],
)
def test_persist_interval(persist, stall, iter_time, steps) -> None:
    assert persist_interval_steps(persist, stall, iter_time) == steps


def test_budget_rejects_non_fraction() -> None:
    with pytest.raises(ValueError, match="fraction"):
        budget_interval_steps(0.1, 0.1, 2.0)


def test_seconds_to_steps() -> None:
    assert seconds_to_steps(10.0, 0.35) == 29
    assert seconds_to_steps(0.01, 1.0) == 1
