"""autockpt_core/policy/checkpoint_cost.py: one checkpoint's cost, added up from the engine's numbers."""

from __future__ import annotations

import pytest

from autockpt_core.policy.checkpoint_cost import STEP_EXCESS_CAP, CheckpointCost, CostMeter, excess_noise
from autockpt_core.policy.profiler import RECENT


@pytest.mark.parametrize(
    ("stall", "waits", "steps", "stall_s", "excess_s"),
    [
        (0.05, [], [], 0.05, 0.0),  # nothing overlapped
        (0.01, [0.03], [0.12], 0.04, 0.02),  # an overlapped copy: a wait and a slower step
        (0.01, [], [0.12, 0.11, 0.09], 0.01, 0.02),  # a persist over three steps, one faster (noise)
        (0.0, [], [10.0], 0.0, STEP_EXCESS_CAP * 0.1 - 0.1),  # one pause is capped
        (-0.001, [-1.0], [-1.0], 0.0, 0.0),  # negative readings (a clock step) are dropped
    ],
)
def test_cost_adds_stall_waits_and_the_excess_of_the_overlapped_steps(
    stall: float, waits: list[float], steps: list[float], stall_s: float, excess_s: float
) -> None:
    meter = CostMeter()
    meter.begin("overlap", stall, 1000, iter_time_s=0.1)
    assert meter.measuring
    for w in waits:
        meter.add_wait(w)
    for s in steps:
        meter.add_step(s)
    cost = meter.finish()
    assert cost is not None and not meter.measuring
    assert cost.mode == "overlap" and cost.nbytes == 1000 and cost.iter_time_s == 0.1
    assert cost.stall_s == pytest.approx(stall_s)
    assert cost.excess_s == pytest.approx(excess_s)
    assert cost.steps == len([s for s in steps if s >= 0])
    assert cost.total_s == pytest.approx(stall_s + excess_s)
    assert meter.finish() is None  # closed


def test_steps_are_compared_with_the_latest_clean_steps_not_the_window_median() -> None:
    meter = CostMeter()
    meter.begin("sync", 0.01, 10, iter_time_s=0.2, step_s=0.1)  # the process got faster lately
    meter.add_step(0.12)
    cost = meter.finish()
    assert cost is not None and cost.excess_s == pytest.approx(0.02) and cost.iter_time_s == 0.2


@pytest.mark.parametrize(("mode", "iter_time"), [(None, 0.1), ("sync", None), ("sync", 0.0)])
def test_nothing_is_measured_without_a_mode_or_a_clean_iteration_time(mode: str | None, iter_time: float | None) -> None:
    meter = CostMeter()
    meter.begin(mode, 0.05, 10, iter_time_s=iter_time)
    meter.add_wait(0.1)
    meter.add_step(0.2)
    assert not meter.measuring and meter.finish() is None


def test_a_new_checkpoint_replaces_an_unfinished_one() -> None:
    meter = CostMeter()
    meter.begin("sync", 1.0, 10, iter_time_s=0.1)
    meter.begin("overlap", 0.5, 10, iter_time_s=0.1)
    assert meter.finish() == CheckpointCost("overlap", 0.5, 0.0, 0, 0.1, 10)


@pytest.mark.parametrize(
    ("sd", "steps", "expected"),
    [
        (None, 3, 0.0),  # unknown noise
        (0.01, 0, 0.0),  # nothing overlapped: no excess, no noise
        (0.01, 1, 0.01 * (1 + 1.2533**2 / RECENT) ** 0.5),
        (0.01, 4, 0.01 * (4 + (4 * 1.2533) ** 2 / RECENT) ** 0.5),  # the reference's error counts 4 times
    ],
)
def test_the_excess_carries_the_noise_of_its_steps_and_of_their_reference(
    sd: float | None, steps: int, expected: float
) -> None:
    meter = CostMeter()
    meter.begin("sync", 0.01, 10, iter_time_s=0.1, step_sd_s=sd)
    for _ in range(steps):
        meter.add_step(0.1)
    cost = meter.finish()
    assert cost is not None and cost.excess_sd_s == pytest.approx(expected)
    assert cost.excess_sd_s == pytest.approx(excess_noise(sd or 0.0, steps))
