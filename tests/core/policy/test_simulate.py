"""The failure simulator: exactness on known cases, common random numbers, and the acceptance
check that autockpt's interval is within 2% of the brute-force best uniform interval."""

import math

import numpy as np
import pytest

from autockpt_core import Config, Estimates, IntervalRules, choose_interval
from autockpt_core.policy.simulate import Failures, Job, best_uniform_interval, simulate, uniform_positions

HOUR = 3600.0


def test_without_failures_wall_is_work_plus_stalls() -> None:
    job = Job(work_s=1000.0, stall_s=2.0, persist_s=5.0, restart_s=30.0)
    r = simulate(100.0, job, Failures(1e12), jobs=100)
    assert r.planned_checkpoints == 9 and r.failures == 0
    assert r.wall_s == pytest.approx(1000.0 + 9 * 2.0)
    assert r.checkpoints == 9 and r.value_lost == 0 and r.rework_s == 0


@pytest.mark.parametrize("tau", [1800.0, 3600.0, 5400.0])
def test_matches_dalys_exact_expected_wall_time(tau: float) -> None:
    # Daly's model (exponential failures, failures during checkpoint and restart):
    # E[wall] = M e^{R/M} (e^{(tau+delta)/M} - 1) * T / tau, for T a multiple of tau.
    mtbf, delta, restart = 6 * HOUR, 300.0, 600.0
    job = Job(work_s=tau * 16, stall_s=delta, restart_s=restart)
    # the last interval has no checkpoint after it: its expected time uses tau, not tau + delta
    expected = mtbf * math.exp(restart / mtbf) * (
        15 * (math.exp((tau + delta) / mtbf) - 1) + (math.exp(tau / mtbf) - 1)
    )
    r = simulate(tau, job, Failures(mtbf), jobs=40_000, seed=1)
    assert r.wall_s == pytest.approx(expected, rel=0.01)


def test_common_random_numbers_and_schedule_forms_agree() -> None:
    job = Job(work_s=20 * HOUR, stall_s=10.0, persist_s=30.0, restart_s=120.0)
    f = Failures(3 * HOUR, shape=0.7)
    a = simulate(600.0, job, f, jobs=2000, seed=7)
    b = simulate(uniform_positions(600.0, job.work_s), job, f, jobs=2000, seed=7)
    assert a == b
    assert simulate(600.0, job, f, jobs=2000, seed=8) != a


def test_value_defaults_to_reworked_fraction_and_persist_latency_costs_rework() -> None:
    job = Job(work_s=10 * HOUR, stall_s=5.0, persist_s=0.0, restart_s=60.0)
    r = simulate(900.0, job, Failures(2 * HOUR), jobs=5000, seed=3)
    assert r.value_lost == pytest.approx(r.rework_s / job.work_s)
    slow = simulate(900.0, Job(10 * HOUR, 5.0, persist_s=300.0, restart_s=60.0), Failures(2 * HOUR), jobs=5000, seed=3)
    assert slow.rework_s > r.rework_s  # a checkpoint protects nothing until it is durable


@pytest.mark.parametrize("shape", [1.0, 0.7, 0.5])
def test_weibull_gaps_have_the_requested_mean(shape: float) -> None:
    f = Failures(100.0, shape)
    gaps = f.from_uniform(np.random.default_rng(0).random(400_000))
    assert gaps.mean() == pytest.approx(100.0, rel=0.02)


def test_bad_schedules_and_hopeless_jobs_raise() -> None:
    job = Job(work_s=100.0, stall_s=1.0, restart_s=1000.0)
    with pytest.raises(ValueError, match="increasing"):
        simulate([10.0, 5.0], job, Failures(50.0))
    with pytest.raises(ValueError, match="positive"):
        simulate(0.0, job, Failures(50.0))
    with pytest.raises(ValueError, match="too frequent"):
        simulate(10.0, job, Failures(1.0), jobs=10, max_rounds=200)


# (stall s, MTBF s, iteration s): the acceptance grid
GRID = [
    (0.12, 900.0, 0.35),
    (0.12, 6 * HOUR, 0.05),
    (0.12, 24 * HOUR, 2.0),
    (2.0, 900.0, 0.05),
    (2.0, 6 * HOUR, 0.35),
    (2.0, 24 * HOUR, 2.0),
    (30.0, 900.0, 2.0),
    (30.0, 6 * HOUR, 0.35),
    (30.0, 24 * HOUR, 0.05),
]


@pytest.mark.parametrize(("stall", "mtbf", "iter_time"), GRID)
def test_chosen_interval_is_within_2_percent_of_brute_force_best(stall, mtbf, iter_time) -> None:
    # A loose budget so that the MTBF rule decides (a binding budget is the user's explicit choice).
    cfg = Config(dirpath="x", overhead_budget=0.5, mtbf=mtbf)
    est = Estimates(iter_time_s=iter_time, stall_s=stall, persist_s=min(2.0, 5 * stall))
    choice = choose_interval(IntervalRules.of(cfg), est)
    assert choice.rule == "daly"
    job = Job(work_s=10 * mtbf, stall_s=stall, persist_s=est.persist_s, restart_s=min(300.0, mtbf / 10))
    failures = Failures(mtbf)
    search = best_uniform_interval(job, failures, jobs=3000, seed=11, points=15, refine=5)
    chosen = simulate(choice.seconds, job, failures, jobs=3000, seed=11)
    assert chosen.waste_s <= 1.02 * search.best.waste_s
