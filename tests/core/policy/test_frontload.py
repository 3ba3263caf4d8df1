"""Front-loaded schedule: the math, the acceptance check in simulation, fallbacks and bounds."""

import math

import numpy as np
import pytest

from autockpt_core import Config, Estimates
from autockpt_core.policy.adjusters import adjusters_from_config
from autockpt_core.policy.decision import CheckpointPolicy, IntervalChoice
from autockpt_core.policy.dryrun import Scenario, constant, dry_run
from autockpt_core.policy.frontload import (
    FrontLoadedSchedule,
    ValueModel,
    equal_count_steps,
    local_interval,
    schedule_steps,
)
from autockpt_core.policy.intervals import young_interval
from autockpt_core.policy.losscurve import LossCurve, fit_loss_curve
from autockpt_core.policy.simulate import Failures, Job, simulate, uniform_positions

H = 20_000  # steps in the run


def curve(beta: float) -> LossCurve:
    """Loss 0.3 + 2·exp(−beta·k/H): the excess loss falls by e^beta over the run."""
    return LossCurve(rate=-beta / H, log_scale=math.log(2.0), floor=0.3)


def test_count_normalisation_keeps_the_number_of_checkpoints() -> None:
    model = ValueModel(curve(5.0), H)
    k = np.linspace(0, H, 20001)
    density = 1 / (300.0 * model.stretch(k, "count"))  # checkpoints per step at a base of 300 steps
    assert np.trapezoid(density, k) == pytest.approx(H / 300.0, rel=1e-3)
    # "value" normalisation: fewer checkpoints than uniform (Jensen), earlier still denser
    assert np.trapezoid(1 / (300.0 * model.stretch(k, "value")), k) < H / 300.0
    gaps = np.diff([0, *schedule_steps(model, 300.0, max_stretch=100.0)])
    assert gaps[0] < 300 < gaps[-1] and np.all(np.diff(gaps) >= -1)  # short early, long late


def test_early_stop_model_moves_value_earlier() -> None:
    plain, stopping = ValueModel(curve(3.0), H), ValueModel(curve(3.0), H, stop_mean_steps=H / 4)
    assert stopping.cumulative(H / 4) > plain.cumulative(H / 4)
    assert stopping.stretch(0.0) < plain.stretch(0.0) and stopping.stretch(H * 0.9) > plain.stretch(H * 0.9)


def test_equal_count_placement_is_uniform_for_a_flat_value_density() -> None:
    model = ValueModel(LossCurve(rate=-1e-9, log_scale=0.0, floor=0.0), H)
    assert np.allclose(equal_count_steps(model, 3), [5000, 10000, 15000], rtol=1e-3)


def value_lost(positions_s, job, failures, model, t):
    return simulate(positions_s, job, failures, jobs=20_000, seed=5, value=lambda p: model.cumulative(p / t)).value_lost


@pytest.mark.parametrize("beta", [4.6, 6.0, 8.0])
def test_front_loaded_loses_20_percent_less_value_than_young_at_equal_cost(beta: float) -> None:
    """Acceptance: schedule from a noisy recorded curve, same number of checkpoints as Young."""
    t, stall, mtbf = 1.0, 2.0, 3600.0
    k = np.arange(0, H, 5.0)
    noisy = curve(beta).loss(k) * (1 + 0.05 * np.random.default_rng(1).standard_normal(k.size))
    fit = fit_loss_curve(k, noisy)
    assert fit.ok and fit.curve is not None
    job, failures = Job(H * t, stall, persist_s=10.0, restart_s=60.0), Failures(mtbf)
    young = uniform_positions(young_interval(stall, mtbf), job.work_s)
    front = equal_count_steps(ValueModel(fit.curve, H), young.size) * t
    true_value = ValueModel(curve(beta), H)
    uniform_loss = value_lost(young, job, failures, true_value, t)
    front_loss = value_lost(front, job, failures, true_value, t)
    assert front_loss <= 0.8 * uniform_loss


def test_online_schedule_in_a_dry_run_beats_uniform_at_equal_count() -> None:
    """The runtime path: policy + FrontLoadedSchedule fitting a noisy loss online."""
    t, stall, mtbf, true = 1.0, 2.0, 3600.0, curve(6.0)
    noise = 1 + 0.1 * np.random.default_rng(2).standard_normal(H + 1)
    scenario = Scenario(
        iter_time=constant(t), stall=constant(stall), persist=constant(10.0),
        loss=lambda k: float(true.loss(k) * noise[k]),
    )
    cfg = Config(dirpath="x", mtbf=mtbf, overhead_budget=0.05, schedule="front_loaded", total_steps=H, adaptive=False)
    adjusters = adjusters_from_config(cfg)
    trace = dry_run(cfg, scenario, H, adjusters)
    steps = np.array([c.step for c in trace.checkpoints], dtype=float)
    assert adjusters[0].active and trace.checkpoints[-1].rule == "front_loaded"
    job, failures, model = Job(H * t, stall, 10.0, 60.0), Failures(mtbf), ValueModel(true, H)
    uniform = np.linspace(0, job.work_s, steps.size + 2)[1:-1]
    assert value_lost(steps * t, job, failures, model, t) <= 0.8 * value_lost(uniform, job, failures, model, t)


def base_choice(**cands: int) -> IntervalChoice:
    cands = {"budget": 10, "persist": 5, "young": 100, "daly": 100, **cands}
    return IntervalChoice(cands["daly"], cands["daly"] * 0.5, "daly", cands)


EST = Estimates(iter_time_s=0.5, stall_s=0.1, persist_s=1.0)


@pytest.mark.parametrize(
    ("losses", "reason"),
    [
        (lambda k: 1.0, "flat"),
        (lambda k: 0.5 + k / 1000, "rising"),
        (lambda k: 1.0 + 0.3 * math.sin(k * 7.0), "flat"),  # noise around a constant
        (lambda k: float("nan"), "not enough loss samples"),
    ],
)
def test_bad_losses_fall_back_to_uniform_with_a_reason(losses, reason) -> None:
    sched = FrontLoadedSchedule(total_steps=5000)
    for k in range(1, 2000):
        sched.observe_step(k, float(k), False, losses(k))
    out = sched.adjust(base_choice(), EST, 0.0)
    assert out.steps == 100 and out.rule == "daly"  # uniform Daly kept
    assert reason in sched.fallback_reason and not sched.active
    assert reason in out.note and reason in out.explain()


def test_no_mtbf_falls_back_and_bounds_are_respected() -> None:
    sched = FrontLoadedSchedule(total_steps=4000, max_stretch=50.0)
    for k in range(1, 2000):
        sched.observe_step(k, float(k), False, 0.3 + 2 * math.exp(-k / 300))
    no_mtbf = IntervalChoice(10, 5.0, "budget", {"budget": 10, "persist": 5})
    assert sched.adjust(no_mtbf, EST, 0.0).steps == 10 and "MTBF" in sched.fallback_reason
    sched.observe_checkpoint(10, 10.0)  # early: would want far less than the budget bound allows
    early = sched.adjust(base_choice(budget=60), EST, 0.0)
    assert early.steps == 60 and early.rule == "budget"
    sched.observe_checkpoint(1990, 1990.0)  # late: long, but capped by max_interval
    late = sched.adjust(base_choice(max_interval=150), EST, 0.0)
    assert late.steps == 150 and late.rule == "max_interval"
    free = sched.adjust(base_choice(), EST, 0.0)
    assert free.rule == "front_loaded" and free.steps > 150 and "front_loaded" in free.explain()


def test_local_interval_clips_the_stretch() -> None:
    model = ValueModel(curve(8.0), H)
    assert local_interval(model, 100, 0, max_stretch=2.0)[0] == 50
    assert local_interval(model, 100, H - 10, max_stretch=2.0)[0] == 200


def test_policy_passes_losses_to_the_schedule() -> None:
    sched = FrontLoadedSchedule()
    policy = CheckpointPolicy(Config(dirpath="x", mtbf=3600, schedule="front_loaded"), sched)
    for k in range(1, 50):
        policy.decide(k, float(k), Estimates(), False, loss=1.0 / k)
    assert sched.tracker.samples == 49
