import pytest

from autockpt_core import Profiler
from autockpt_core.policy.rank_timing import RankTimes, StepClock


class Clock:
    def __init__(self) -> None:
        self.t = 10.0

    def __call__(self) -> float:
        return self.t


def test_step_clock_times_each_step_net_of_the_checkpoint_that_blocked_it() -> None:
    clock = Clock()
    timer = StepClock(clock)
    assert timer.lap() == RankTimes(0.0, 0.0)  # before start: nothing to time
    timer.start()
    clock.t += 0.2
    assert timer.lap() == RankTimes(pytest.approx(0.2), 0.0)
    timer.add_blocked(0.05)  # the checkpoint after that step (its collectives, the copy)
    clock.t += 0.05 + 0.2
    timer.add_blocked(0.01)  # waiting for an overlapped copy before the next update
    clock.t += 0.01
    assert timer.lap() == RankTimes(pytest.approx(0.2), pytest.approx(0.06))
    clock.t += 0.3
    assert timer.lap() == RankTimes(pytest.approx(0.3), 0.0)  # blocking counted once


@pytest.mark.parametrize(
    "times, slowest",
    [
        ([RankTimes(0.1, 0.0)], RankTimes(0.1, 0.0)),
        ([RankTimes(0.1, 0.02), RankTimes(0.3, 0.01)], RankTimes(0.3, 0.02)),
        ([RankTimes(0.2, 0.0), RankTimes(0.1, 0.5), RankTimes(0.15, 0.1)], RankTimes(0.2, 0.5)),
    ],
)
def test_slowest_takes_each_figure_from_the_rank_that_is_slowest_in_it(
    times: list[RankTimes], slowest: RankTimes
) -> None:
    assert RankTimes.slowest(times) == slowest


def test_profiler_revisions_touch_the_newest_kept_sample_only() -> None:
    p = Profiler(warmup_steps=2, window=10)
    p.record_iteration(9.0)
    p.revise_last_iteration(7.0)  # a warm-up sample was not kept: nothing to revise
    p.record_iteration(9.0)
    for _ in range(4):
        p.record_iteration(0.1)
    p.revise_last_iteration(0.3)
    assert p.estimates().iter_time_s == pytest.approx(0.1) and p.estimates().recent_iter_time_s == pytest.approx(0.1)
    for _ in range(4):
        p.record_iteration(0.1)
        p.revise_last_iteration(0.3)
    assert p.estimates().iter_time_s == pytest.approx(0.3)  # 5 of 8 clean samples are now the slow rank's
    p.record_iteration(0.2, loaded=True)
    p.revise_last_iteration(0.6)
    assert p.estimates().loaded_iter_time_s == pytest.approx(0.6)
    assert p.revise_last_stall(1.0) == 0.0  # no stall recorded yet
    p.record_stall(0.01, 100)
    assert p.revise_last_stall(0.005) == 0.0 and p.estimates().stall_s == pytest.approx(0.01)  # never lowered
    assert p.revise_last_stall(0.04) == pytest.approx(0.03) and p.estimates().stall_s == pytest.approx(0.04)
