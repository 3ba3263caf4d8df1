"""Adaptive re-tuning on a fake clock: drift in iteration time, stall or background slowdown.

Acceptance: after the drift the interval adapts within a few checkpoints, the measured overhead
returns under the budget, and the interval does not oscillate. No real sleeping anywhere.
"""

import dataclasses

import numpy as np
import pytest

from autockpt_core import CheckpointSession, Config, Snapshot
from autockpt_core.persist.storage import LocalStorage
from autockpt_core.policy.adaptive import AdaptiveTuner, Window
from autockpt_core.policy.adjusters import adjusters_from_config
from autockpt_core.policy.dryrun import Scenario, constant, dry_run, switch
from autockpt_core.policy.frontload import FrontLoadedSchedule
from autockpt_core.policy.intervals import daly_interval

MID, STEPS, BUDGET = 4000, 9000, 0.02
CFG = Config(dirpath="x", overhead_budget=BUDGET)

SCENARIOS = [
    # id, scenario, how the interval (in steps) must move after step MID
    ("iteration time doubles", Scenario(iter_time=switch(MID, 0.1, 0.2), stall=constant(0.05)), "shorter"),
    (
        "iterations overlapping checkpoint work double",
        Scenario(iter_time=constant(0.1), persist=constant(1.0), slowdown=switch(MID, 0.0, 1.0)),
        "longer",
    ),
    ("stall doubles", Scenario(stall=switch(MID, 0.05, 0.1)), "longer"),
    ("stall halves", Scenario(stall=switch(MID, 0.1, 0.05)), "shorter"),
]


def monotone(values: list[int], direction: str, slack: int = 1) -> bool:
    """No move against ``direction`` by more than ``slack`` steps (the profiler's upper bound of
    the cost moves by a step while old and new iterations share its window)."""
    pairs = list(zip(values, values[1:]))
    if direction == "shorter":
        return all(b <= a + slack for a, b in pairs)
    return all(b >= a - slack for a, b in pairs)


@pytest.mark.parametrize(("scenario", "direction"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_interval_adapts_within_a_few_checkpoints_without_oscillating(scenario, direction) -> None:
    tuner = AdaptiveTuner(CFG)
    trace = dry_run(CFG, scenario, STEPS, [tuner])
    ckpts = [c for c in trace.checkpoints if c.interval_steps is not None]
    first_after = next(i for i, c in enumerate(ckpts) if c.step > MID)
    before = ckpts[first_after - 1].interval_steps
    after = [c.interval_steps for c in ckpts[first_after:]]
    settled = after[-1]
    assert (settled < before) if direction == "shorter" else (settled > before)
    assert all(abs(s - settled) <= 1 for s in after[4:]), after[:8]  # adapted within 4 checkpoints
    assert monotone(after, direction)  # no back and forth
    assert len({c.direction for c in tuner.changes if c.step > MID}) <= 1
    assert trace.overhead(ckpts[first_after + 4].step, STEPS) <= BUDGET  # overhead back under budget
    assert trace.overhead(ckpts[first_after + 4].step, STEPS) >= 0.5 * BUDGET  # ...and not wasted


def test_without_tuning_the_background_slowdown_stays_over_budget_longer() -> None:
    scenario = SCENARIOS[1][1]
    tuned = dry_run(CFG, scenario, STEPS, [AdaptiveTuner(CFG)])
    plain = dry_run(CFG, scenario, STEPS, [])
    window = (MID + 300, MID + 2000)
    assert tuned.overhead(*window) <= BUDGET < plain.overhead(*window)
    change = tuned.policy.current
    assert change is not None and change.rule == "adaptive:budget"
    assert "overhead" in change.note and "measured cost" in change.explain()


def test_jittery_iterations_do_not_make_it_oscillate() -> None:
    jitter = np.clip(1 + 0.2 * np.random.default_rng(0).standard_normal(20_001), 0.2, None)
    scenario = Scenario(iter_time=lambda k: 0.1 * jitter[k], persist=constant(0.5), slowdown=constant(0.3))
    tuner = AdaptiveTuner(CFG)
    trace = dry_run(CFG, scenario, 20_000, [tuner])
    assert len(tuner.changes) <= 2
    assert [c.direction for c in tuner.changes].count("shorten") <= 1
    assert trace.overhead(2000, 20_000) <= BUDGET


def test_with_an_mtbf_it_shortens_only_toward_daly() -> None:
    cfg = Config(dirpath="x", overhead_budget=0.05, mtbf=600)
    scenario = Scenario(iter_time=constant(0.1), stall=switch(3000, 0.5, 0.05), persist=constant(0.2))
    tuner = AdaptiveTuner(cfg)
    trace = dry_run(cfg, scenario, 8000, [tuner])
    final = trace.policy.current
    assert final is not None and final.rule == "adaptive:daly"
    assert final.steps == final.candidates["daly"] > final.candidates["budget"]


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_session_adapts_when_iteration_time_doubles(tmp_path) -> None:
    """Drive a real CheckpointSession (sync persist, fake snapshot) on an injected clock."""
    clock = FakeClock()
    cfg = Config(dirpath=str(tmp_path), overhead_budget=BUDGET, warmup_steps=3, async_persist=False, keep_last=1)
    storage = LocalStorage(tmp_path, fsync=False)
    session = CheckpointSession(cfg, framework="np", suffix=".bin", clock=clock, storage=storage)
    assert [type(a) for a in session.policy.adjusters] == [AdaptiveTuner]

    def snapshot(pool):
        clock.t += 0.01  # the copy blocks training for 10 ms
        return Snapshot(write=lambda f: f.write(b"x"), nbytes=1)

    session.start(0)
    ends, ideal, saves = [0.0], [0.0], []
    for step in range(1, 3001):
        t = 0.1 if step <= 1500 else 0.2
        clock.t += t
        decision = session.step_end(step, loss=1.0)
        if decision.save:
            session.save(step, 0, snapshot)
            saves.append((step, decision.interval.steps if decision.interval else None))
        ends.append(clock.t)
        ideal.append(t)
    session.finish()
    after = [k for s, k in saves if s > 1500]
    assert saves[-1][1] < [k for s, k in saves if s <= 1500][-1]  # fewer steps at twice the step time
    assert all(k == after[-1] for k in after[4:]) and monotone(after, "shorter")
    start = [s for s, _ in saves if s > 1500][4]
    overhead = (ends[3000] - ends[start]) / sum(ideal[start + 1 :]) - 1
    assert overhead <= BUDGET


def test_config_builds_the_adjusters_in_order() -> None:
    assert adjusters_from_config(Config(dirpath="x", adaptive=False)) == []
    both = adjusters_from_config(Config(dirpath="x", mtbf="6h", schedule="front_loaded", total_steps=1000))
    assert [type(a) for a in both] == [AdaptiveTuner, FrontLoadedSchedule]
    assert both[1].total_steps == 1000


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"target": 0.0}, "target"), ({"shorten_ratio": 1.0}, "shorten_ratio"), ({"settle": 0}, "settle")],
)
def test_tuner_rejects_bad_settings(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        AdaptiveTuner(CFG, **kwargs)


def test_the_budget_is_approached_from_below_from_the_first_checkpoints() -> None:
    # 30% step jitter; the persist (1 s) slows the steps it overlaps by 50%: a checkpoint costs
    # 20 ms + 1 s × 0.5 / 1.5 ≈ 0.353 s, so 2% of 0.1 s steps allows one every ~177 steps.
    early, final = [], []
    for seed in range(6):
        jitter = np.clip(1 + 0.3 * np.random.default_rng(seed).standard_normal(8001), 0.2, None)
        scenario = Scenario(iter_time=lambda k, j=jitter: 0.1 * j[k], stall=constant(0.02), persist=constant(1.0),
                            slowdown=constant(0.5))
        trace = dry_run(CFG, scenario, 8000, [AdaptiveTuner(CFG)])
        first = trace.checkpoints[1].step  # the first after the profiling checkpoint
        early.append(trace.overhead(first, first + 1500))
        final.append(trace.checkpoints[-1].interval_steps)
    # the first ~8 checkpoints keep the budget (a mean of a noisy first measurement did not)
    assert float(np.median(early)) <= BUDGET and max(early) <= 1.05 * BUDGET, early
    assert all(177 <= k <= 2 * 177 for k in final), final  # converged, and not over-cautious


STEADY = Scenario(iter_time=constant(0.1), stall=constant(0.05), persist=constant(1.0))


@pytest.mark.parametrize("after_checkpoint", [2, 20], ids=["during a persist", "between persists"])
def test_one_machine_stall_moves_no_interval(after_checkpoint: int) -> None:
    plain = dry_run(CFG, STEADY, 6000, [AdaptiveTuner(CFG)])
    at = next(c.step for c in plain.checkpoints if c.step > 3000) + after_checkpoint
    stalled = dataclasses.replace(STEADY, iter_time=lambda k: 20.0 if k == at else 0.1)
    tuner = AdaptiveTuner(CFG)
    trace = dry_run(CFG, stalled, 6000, [tuner])
    assert trace.intervals() == plain.intervals()
    assert tuner.changes == [] and tuner.giants.giants == 1 and not tuner.giants.checkpoint_caused()


def test_stalls_every_persist_causes_lengthen_the_interval() -> None:
    caused = dataclasses.replace(STEADY, slowdown=switch(3000, 0.0, 9.0))  # loaded steps take 1 s from step 3000
    tuner = AdaptiveTuner(CFG)
    trace = dry_run(CFG, caused, 6000, [tuner])
    assert tuner.giants.checkpoint_caused()
    assert [c.direction for c in tuner.changes] == ["lengthen"]
    assert trace.intervals()[-1] > 10 * trace.intervals()[0]
    untuned = dry_run(CFG, caused, 6000, [])
    assert trace.overhead(4000, 6000) <= BUDGET < untuned.overhead(4000, 6000)


def test_a_window_leaves_out_its_giant_loaded_steps_only_on_request() -> None:
    window = Window(10, 100, 30.0, 0.1, 0.0, 80, loaded_giants=(20.0,))
    assert window.cost(0.1) == pytest.approx(20.0)
    assert window.without_giants().cost(0.1) == pytest.approx(0.1)  # 99 steps in 10.0 s
    assert Window(10, 100, 10.0, 0.1).without_giants() == Window(10, 100, 10.0, 0.1)


@pytest.mark.parametrize(
    ("mtbf", "steps", "rule"),
    [
        # stall 3 ms + 50 ms of persist slowing its steps by 2%: 3.98 ms / (2% x 1.6 ms) -> 125
        (None, 125, "budget"),
        # told the MTBF: Daly at that measured cost (within the budget there)
        (20.0, round(daly_interval(0.003 + 0.05 * 0.02 / 1.02, 20.0) / 0.0016), "daly"),
    ],
)
def test_short_steps_get_the_interval_of_their_measured_cost_from_the_first_interval_on(mtbf, steps, rule) -> None:
    """The profiling checkpoint's persist measures its own slowdown; the next interval already
    rests on it (not on the whole persist time), and stays there."""
    cfg = Config(dirpath="x", overhead_budget=0.02, mtbf=mtbf)
    scenario = Scenario(iter_time=constant(0.0016), stall=constant(0.003), persist=constant(0.05),
                        slowdown=constant(0.02))  # fmt: skip
    trace = dry_run(cfg, scenario, 3000, adjusters_from_config(cfg))
    first = trace.checkpoints[1:4]  # the three after the profiling checkpoint
    assert [(c.interval_steps, c.rule) for c in first] == [(steps, rule)] * 3
    assert trace.overhead(200, 3000) <= 0.02
