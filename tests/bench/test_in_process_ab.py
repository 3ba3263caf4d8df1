"""The in-process A/B of the study (``autockpt_bench.study.in_process_ab``): which steps are on,
what a held-back checkpoint becomes, and the figures from synthetic step times where the
answer is known."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from autockpt_bench.study.in_process_ab import Alternation, ab_block, ab_figures
from autockpt_core.policy.decision import Decision


@pytest.mark.parametrize(("every", "block"), [(1, 12), (3, 12), (5, 15), (7, 14), (12, 12), (13, 13), (1000, 1000)])
def test_a_block_is_a_whole_number_of_intervals_of_twelve_steps_or_more(every: int, block: int) -> None:
    assert ab_block(every) == block


def test_an_interval_below_one_step_is_refused() -> None:
    with pytest.raises(ValueError, match="every"):
        ab_block(0)


@pytest.mark.parametrize(("step", "on"), [(1, True), (5, True), (6, True), (17, True), (18, False), (29, False),
                                          (30, True), (42, False)])
def test_blocks_alternate_after_the_warm_up(step: int, on: bool) -> None:
    assert Alternation(block=12, warmup=5).is_on(step) is on


@dataclasses.dataclass
class _Writer:
    busy: bool = False


class _Ledger:
    def __init__(self) -> None:
        self.steps: list[tuple[float, bool]] = []
        self.start_time = 0.0

    def step(self, seconds: float, loaded: bool) -> None:
        self.steps.append((seconds, loaded))


class _Session:
    """Stands in for a CheckpointSession: checkpoints every 4 steps; step 7 overlaps a persist."""

    def __init__(self) -> None:
        self.ledger, self.writer = _Ledger(), _Writer()

    def record_steps(self, steps: list[int], ends: list[float], losses: Any = None) -> None:
        for step in steps:
            self.ledger.step(0.01, step == 7)

    def decide(self, step: int, now: float) -> Decision:
        return Decision(step % 4 == 0, "every_n_steps=4")

    def step_end(self, step: int) -> Decision:
        """As the driver calls it: the steps since the last decision, then the decision."""
        self.record_steps([step], [0.0])
        return self.decide(step, 0.0)


def test_a_checkpoint_due_in_an_off_block_is_held_back_and_the_meters_flags_are_kept() -> None:
    session, ab = _Session(), Alternation(block=4, warmup=0)
    ab.attach(session)
    saves = {step: session.step_end(step).save for step in range(1, 17)}
    assert [s for s, save in saves.items() if save] == [4, 12]  # 5-8 and 13-16 are off
    assert session.step_end(8).reason.startswith("held back")
    assert ab.loaded[7] is True and ab.loaded[6] is False
    assert len(session.ledger.steps) == 17  # the session still records every step
    session.record_steps([17, 18, 19], [0.0] * 3)  # a batch from the driver's hot path
    assert [ab.loaded.get(s) for s in (17, 18, 19)] == [False] * 3 and len(session.ledger.steps) == 20
    session.writer.busy = True
    ab.step_done(9)
    assert ab.busy_after[9] is True


def _run(on_block: list[float], off_block: list[float], cycles: int, loaded: set[int] | None = None,
         busy: set[int] | None = None) -> tuple[dict[int, float], dict[int, bool], dict[int, bool], dict[int, bool]]:
    """Step times of ``cycles`` (on block, off block) pairs from step 1; ``loaded`` and ``busy``
    as positions within an on block / an off block."""
    durations: dict[int, float] = {}
    on: dict[int, bool] = {}
    flags: dict[int, bool] = {}
    after: dict[int, bool] = {}
    step = 0
    for _ in range(cycles):
        for part, times in ((True, on_block), (False, off_block)):
            for i, t in enumerate(times):
                step += 1
                durations[step], on[step] = t, part
                flags[step] = part and i in (loaded or set())
                after[step] = not part and i in (busy or set())
    return durations, on, after, flags


def test_a_cost_in_the_loaded_steps_is_seen_by_both_the_ab_and_the_meter() -> None:
    on_block = [0.010] * 12
    for i in (3, 7, 11):
        on_block[i] = 0.015
    figures = ab_figures(*_run(on_block, [0.010] * 12, cycles=3, loaded={3, 7, 11}), guard=0)
    assert figures["ab_overhead"] == pytest.approx(15 / 120)
    assert figures["ab_meter_view"] == pytest.approx(15 / 120)
    assert figures["ab_cycles"] == pytest.approx([15 / 120] * 3)
    assert figures["ab_noise"] == pytest.approx(0.0)
    assert figures["ab_reference_spread"] == pytest.approx(0.0)


def test_a_slowdown_of_the_steps_the_meter_takes_as_clean_is_seen_by_the_ab_only() -> None:
    on_block = [0.011] * 12  # every step after the first checkpoint is 1 ms slower, none loaded
    for i in (3, 7, 11):
        on_block[i] = 0.015
    figures = ab_figures(*_run(on_block, [0.010] * 12, cycles=2, loaded={3, 7, 11}), guard=0)
    assert figures["ab_overhead"] == pytest.approx((3 * 5 + 9 * 1) / 120)
    assert figures["ab_meter_view"] == pytest.approx(3 * 4 / (12 * 11))


def test_a_persist_that_runs_into_the_off_block_is_charged_to_its_cycle() -> None:
    off_block = [0.014, 0.014] + [0.010] * 10
    figures = ab_figures(*_run([0.010] * 12, off_block, cycles=2, busy={0, 1}), guard=0)
    assert figures["ab_overhead"] == pytest.approx(2 * 4 / 120)
    assert figures["ab_spill_steps"] == 2
    guarded = ab_figures(*_run([0.010] * 12, off_block, cycles=2, busy={0}), guard=1)
    assert guarded["ab_overhead"] == pytest.approx(2 * 4 / 120)


def test_drift_between_blocks_is_averaged_around_each_on_block() -> None:
    durations, on, after, flags = _run([0.011] * 10, [0.010] * 10, cycles=2)
    for step in range(31, 41):  # the second off block runs at 12 ms
        durations[step] = 0.012
    figures = ab_figures(durations, on, after, flags, guard=0)
    assert figures["ab_cycles"][0] == pytest.approx(0.011 / 0.010 - 1)
    assert figures["ab_cycles"][1] == pytest.approx(0.011 / 0.011 - 1)
    assert figures["ab_reference_spread"] == pytest.approx(0.002 / 0.011)
    assert figures["ab_noise"] > 0


def test_without_an_off_block_after_an_on_block_there_is_nothing_to_compare() -> None:
    durations = {s: 0.01 for s in range(1, 13)}
    figures = ab_figures(durations, {s: True for s in durations}, {}, {}, guard=0)
    assert figures["ab_overhead"] is None and figures["ab_cycles"] == [] and figures["ab_noise"] is None


def test_a_stall_far_longer_than_a_step_is_left_out_of_both_arms_and_listed() -> None:
    on_block = [0.010] * 12
    on_block[3] = 0.015
    durations, on, after, flags = _run(on_block, [0.010] * 12, cycles=2, loaded={3})
    durations[6] = 2.0  # an epoch boundary's stall in the first on block
    durations[20] = 2.0  # and one in the first off block's reference
    figures = ab_figures(durations, on, after, flags, guard=0)
    assert figures["ab_overhead"] == pytest.approx((5 / (11 * 10) + 5 / (12 * 10)) / 2)  # 11 steps kept in the first
    assert figures["ab_excluded"] == [[6, 2.0, True], [20, 2.0, False]]


def test_without_an_outlier_factor_every_step_counts() -> None:
    on_block = [0.010] * 12
    on_block[3] = 0.080  # a host's view of a device: the checkpoint's step waits for the queued steps
    figures = ab_figures(*_run(on_block, [0.010] * 12, cycles=2, loaded={3}), guard=0, outlier_factor=None)
    assert figures["ab_overhead"] == pytest.approx(0.070 / 0.120)
    assert figures["ab_excluded"] == []


def test_the_alternation_figures_its_blocks_without_the_warm_up() -> None:
    ab = Alternation(block=12, warmup=6)
    after, _, busy, flags = _run([0.011] * 12, [0.010] * 12, cycles=2)
    durations = {s + 6: t for s, t in after.items()} | {s: 9.0 for s in range(1, 7)}  # a slow warm-up
    ab.busy_after = {s + 6: b for s, b in busy.items()}
    ab.loaded = {s + 6: f for s, f in flags.items()}
    figures = ab.figures(durations)
    assert figures == ab_figures(*_run([0.011] * 12, [0.010] * 12, cycles=2), guard=6)
    assert figures["ab_overhead"] == pytest.approx(0.1)
