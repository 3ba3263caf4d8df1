import dataclasses
import math
import random
import statistics

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from autockpt_core.policy.overhead_meter import Overhead, OverheadMeter, overhead_text
from autockpt_core.summary import RunSummary


def meter_of(steps, blocked=0.0, warmup=0):
    meter = OverheadMeter(warmup)
    for seconds, loaded in steps:
        meter.step(seconds, loaded)
    meter.blocked(blocked)
    return meter


@pytest.mark.parametrize(
    "steps, blocked, value",
    [
        # 8 clean steps of 0.1 s, 2 loaded of 0.15 s: extra 0.1 s over 10 × 0.1 s of work
        ([(0.1, False)] * 8 + [(0.15, True)] * 2, 0.0, 0.1),
        # the blocked time counts on top of the slower steps
        ([(0.1, False)] * 8 + [(0.15, True)] * 2, 0.05, 0.15),
        # loaded steps as fast as clean ones, no blocked time: no overhead
        ([(0.1, False)] * 5 + [(0.1, True)] * 5, 0.0, 0.0),
        # only blocked time
        ([(0.2, False)] * 10, 0.1, 0.05),
        # loaded steps faster than clean ones (noise): negative, reported as measured
        ([(0.1, False)] * 4 + [(0.08, True)] * 2, 0.0, -0.04 / 0.6),
    ],
)
def test_overhead_is_extra_wall_time_over_the_clean_time_of_the_same_steps(steps, blocked, value) -> None:
    reading = meter_of(steps, blocked).reading()
    assert reading.value == pytest.approx(value)
    assert reading.steps == len(steps)
    assert reading.noise == pytest.approx(0.0, abs=1e-12)  # identical clean steps: no noise


@pytest.mark.parametrize(
    "steps, blocked",
    [
        ([], 0.0),
        ([(0.1, False)], 0.05),  # one clean step: no mean with a spread
        ([(0.1, False)] * 10, 0.0),  # nothing checkpointed: nothing to report
        ([(0.1, True)] * 10, 0.1),  # no clean step to compare with
    ],
)
def test_nothing_is_reported_without_clean_steps_and_checkpoint_work(steps, blocked) -> None:
    reading = meter_of(steps, blocked).reading()
    assert reading.value is None and reading.noise is None and reading.band is None


def test_warmup_steps_are_not_counted() -> None:
    slow_start = [(5.0, False)] * 3 + [(0.1, False)] * 10 + [(0.2, True)]
    assert meter_of(slow_start, warmup=3).reading().value == pytest.approx(0.1 / 1.1)
    assert meter_of(slow_start, warmup=0).reading().value < 0  # the slow start would hide it


def test_noise_follows_the_clean_spread_and_the_number_of_loaded_steps() -> None:
    rng = random.Random(0)
    clean = [0.1 + rng.gauss(0, 0.01) for _ in range(400)]
    loaded = [0.1 + rng.gauss(0, 0.01) for _ in range(40)]
    reading = meter_of([(s, False) for s in clean] + [(s, True) for s in loaded]).reading()
    sd = statistics.stdev(clean)
    work = 440 * statistics.fmean(clean)
    assert reading.noise == pytest.approx(sd * math.sqrt(40 + 40 * 40 / 400) / work)
    assert abs(reading.value) < 3 * reading.noise  # no real slowdown: within the noise


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.001, 1.0), st.booleans()), min_size=3, max_size=40),
    st.floats(0.001, 1.0),
)
@example(steps=[(1.0, False), (1.0, True), (0.7439223672590388, False)], new=1.0)  # found by CI
def test_revising_the_last_step_equals_having_counted_the_new_duration(steps, new) -> None:
    revised = meter_of(steps)
    revised.revise_last_step(new)
    direct = meter_of(steps[:-1] + [(new, steps[-1][1])])
    a, b = revised.reading(), direct.reading()
    assert a.steps == b.steps
    if b.value is None:
        assert a.value is None
    else:
        assert a.value == pytest.approx(b.value, rel=1e-6, abs=1e-9)
        # The noise is a square root of the clean steps' variance: where that is 0, the rounding
        # left by taking a step back out of the running sums (about 1e-18) comes out near 1e-9.
        assert a.noise == pytest.approx(b.noise, rel=1e-6, abs=1e-6)


def test_a_warmup_step_is_not_revised() -> None:
    meter = meter_of([(0.1, False)] * 4 + [(0.2, True)], warmup=5)
    meter.revise_last_step(9.0)
    assert meter.reading().steps == 0


@pytest.mark.parametrize(
    "value, band, budget, text",
    [
        (0.0123, 0.004, 0.02, "1.23% ±0.40% (budget 2.00%)"),
        (0.10, 0.03, 0.02, "10.00% ±3.00% (budget 2.00%)"),  # noisy, but clearly over the budget
        (0.008, 0.031, 0.02, "unresolved (step-time noise ±3.10% > budget 2.00%)"),
        (None, None, 0.05, "n/a (budget 5.00%)"),
    ],
)
def test_the_text_says_when_the_noise_is_larger_than_the_budget(value, band, budget, text) -> None:
    assert overhead_text(value, band, budget) == text
    assert Overhead(value, None if band is None else band / 2, 10).text(budget) == text


def test_the_summary_line_prints_the_measured_overhead_with_its_band() -> None:
    summary = RunSummary(
        framework="np", checkpoints=3, mean_stall_s=0.01, checkpoint_bytes=1000, overhead=0.015,
        budget=0.02, interval_steps=10, interval_rule="budget", newest_step=30, newest_path="x",
        overhead_band=0.004,
    )  # fmt: skip
    assert "overhead 1.50% ±0.40% (budget 2.00%)," in summary.line()
    stalled = dataclasses.replace(summary, left_out_steps=2, left_out_s=40.5)
    assert "(budget 2.00%), 2 stalled steps (40.5s) left out as the machine's, interval" in stalled.line()
    assert "host's clock" not in summary.line() and summary.hooks_warning() is None
    noted = dataclasses.replace(summary, clock_note="costs read on the host's clock: no device probe", hooks=0.005,
                                hook_us=50.0)  # fmt: skip
    assert noted.line().endswith("-> x; costs read on the host's clock: no device probe")
    assert "(budget 2.00%), hooks 50µs/step (0.50% of a step), interval" in noted.line()
    assert "0.50% of the step time" in (noted.hooks_warning() or "")  # over a tenth of the 2% budget


@pytest.mark.parametrize(
    "steps, hooks, warmup, value, share",
    [
        # 10 clean steps of 0.1 s, 2 ms of hook in each: 2% of a step, and no checkpoint cost
        ([(0.1, False)] * 10, [0.002] * 10, 0, None, 0.02),
        # the loaded steps' extra time is the checkpoints'; the hooks are reported beside it
        ([(0.1, False)] * 8 + [(0.15, True)] * 2, [0.001] * 10, 0, 0.1, 0.01),
        # the warm-up steps' hooks are not counted, like the steps
        ([(0.1, False)] * 12, [1.0, 1.0] + [0.002] * 10, 2, None, 0.02),
        # no hook time, no checkpoint
        ([(0.1, False)] * 10, [0.0] * 10, 0, None, 0.0),
    ],
)
def test_the_hooks_own_time_is_measured_apart_from_the_checkpoints_cost(steps, hooks, warmup, value, share) -> None:
    meter = OverheadMeter(warmup)
    for (seconds, loaded), hook in zip(steps, hooks):
        meter.step(seconds, loaded)
        meter.hooks(hook)
    reading = meter.reading()
    assert reading.value == (pytest.approx(value) if value is not None else None)
    assert reading.hooks == pytest.approx(share)


def _blocks(cycles: int, loaded_step: float, giant_at: dict[int, float] | None = None) -> list[tuple[float, bool]]:
    """``cycles`` of 90 clean steps of 0.1 s then 10 loaded ones of ``loaded_step``; ``giant_at``
    replaces the step at an index with a stall."""
    steps = ([(0.1, False)] * 90 + [(loaded_step, True)] * 10) * cycles
    for i, seconds in (giant_at or {}).items():
        steps[i] = (seconds, steps[i][1])
    return steps


@pytest.mark.parametrize(
    "giant_at, value, left_out",
    [
        ({}, 1.0 / 100.0, 0),  # 10 loaded steps of 0.11 s per cycle: +1%
        ({95: 20.0}, 0.99 / 99.9, 1),  # one 20 s stall during a persist: left out of both sides
        ({40: 20.0}, 1.0 / 99.9, 1),  # one in a clean step: left out too (the mean stays 0.1 s)
        ({40: 20.0, 250: 20.0, 95: 20.0}, 0.99 / 99.7, 3),  # as frequent in clean steps as in loaded ones
    ],
)
def test_a_machines_stall_is_left_out_of_both_sides_and_counted(giant_at: dict[int, float], value: float,
                                                                 left_out: int) -> None:
    reading = meter_of(_blocks(10, 0.11, giant_at)).reading()
    assert reading.value == pytest.approx(value)
    assert reading.left_out == left_out
    assert reading.left_out_s == pytest.approx(20.0 * left_out)


def test_stalls_every_checkpoint_causes_count_as_its_cost() -> None:
    stalls = {100 * c + 95: 2.0 for c in range(10)}  # one 2 s step in the loaded steps of every cycle
    meter = meter_of(_blocks(10, 0.11, stalls))
    reading = meter.reading()
    assert meter.giant_rates.checkpoint_caused()
    assert reading.left_out == 0
    assert reading.value == pytest.approx((90 * 0.01 + 10 * (2.0 - 0.1)) / (1000 * 0.1))


def test_a_revised_step_moves_between_giant_and_normal() -> None:
    meter = meter_of([(0.1, False)] * 10 + [(0.15, True)])
    meter.revise_last_step(5.0)  # the slowest rank's time: a stall
    assert meter.reading().left_out == 1 and meter.giant_rates.loaded_giants == 1
    meter.revise_last_step(0.15)
    reading = meter.reading()
    assert reading.left_out == 0 and meter.giant_rates == type(meter.giant_rates)(10, 0, 1, 0)
    assert reading.value == pytest.approx(0.05 / 1.1)
