"""Policy engine wiring: adjuster hooks and order, explanations, config fields, session wiring."""

import pytest

from autockpt_core import CheckpointSession, Config, ConfigError, Estimates
from autockpt_core.persist.storage import LocalStorage
from autockpt_core.policy.decision import Adjuster, CheckpointPolicy, IntervalChoice
from autockpt_core.policy.frontload import FrontLoadedSchedule

# the persist's slowdown measured over many loaded iterations: none (its cost is the stall alone)
READY = Estimates(iter_time_s=0.1, stall_s=0.01, persist_s=0.05, loaded_iter_time_s=0.1, loaded_iterations=50,
                  loaded_sd_s=0.0, iterations_seen=100, checkpoints_seen=1)


class Recorder(Adjuster):
    def __init__(self, log: list, name: str, factor: int) -> None:
        self.log, self.name, self.factor = log, name, factor

    def observe_start(self, step, now):
        self.log.append((self.name, "start", step))

    def observe_step(self, step, now, persist_busy, loss):
        self.log.append((self.name, "step", step, loss))

    def observe_checkpoint(self, step, now):
        self.log.append((self.name, "checkpoint", step))

    def adjust(self, choice, est, elapsed_s):
        self.log.append((self.name, "adjust", choice.steps))
        return IntervalChoice(choice.steps * self.factor, choice.seconds * self.factor, f"{self.name}:{choice.rule}")


def test_adjusters_are_chained_in_order_and_see_every_hook() -> None:
    log: list = []
    policy = CheckpointPolicy(Config(dirpath="x"), [Recorder(log, "a", 2), Recorder(log, "b", 3)])
    policy.start(0.0, 10)
    decision = policy.decide(11, 1.0, READY, False, loss=0.5)
    policy.record_checkpoint(11, 1.1)
    assert decision.interval is not None and decision.interval.rule == "b:a:budget"
    assert decision.interval.steps == 5 * 2 * 3  # budget 0.01/(0.02·0.1) = 5 steps, then ×2, ×3
    assert log == [
        ("a", "start", 10), ("b", "start", 10),
        ("a", "step", 11, 0.5), ("b", "step", 11, 0.5),
        ("a", "adjust", 5), ("b", "adjust", 10),
        ("a", "checkpoint", 11), ("b", "checkpoint", 11),
    ]


# the persist takes 10 steps: a checkpoint started at step s is durable after about s + 10.1
SLOW_PERSIST = Estimates(iter_time_s=0.1, stall_s=0.01, persist_s=1.0, loaded_iter_time_s=0.1,
                         loaded_iterations=50, loaded_sd_s=0.0, iterations_seen=100, checkpoints_seen=1)


@pytest.mark.parametrize(
    ("config", "end_step", "step", "saves"),
    [
        ({}, None, 10, True),  # the end is not known
        ({}, 15, 10, False),  # the final checkpoint (after step 15) comes before this one is durable
        ({}, 20, 10, False),  # 10 steps = 1.0 s < 1.01 s
        ({}, 21, 10, True),  # 11 steps = 1.1 s: this one is durable first
        ({}, 10, 10, True),  # the planned end is here or behind: the estimate was off
        ({}, 7, 10, True),
        ({"every_n_steps": 10}, 15, 10, True),  # the user asked for these steps
        ({"max_interval": 0.5}, 15, 10, True),  # and for at most this long without one
    ],
)
def test_an_interval_checkpoint_the_final_one_would_follow_before_it_is_durable_is_skipped(
    config: dict, end_step: int | None, step: int, saves: bool
) -> None:
    policy = CheckpointPolicy(Config(dirpath="x", **config))
    policy.start(0.0, 0)
    policy.expect_end(end_step)
    decision = policy.decide(step, 1.0, SLOW_PERSIST, False)
    assert decision.save is saves
    if not saves:
        assert decision.reason == (
            f"interval 10 steps reached (persist); skipped: the final checkpoint after step {end_step} comes "
            "before this one would be durable"
        )
        assert policy.decide(step + 1, 1.1, SLOW_PERSIST, False).save is False  # and at each step to the end


def test_plain_callable_adjuster_still_works_and_explain() -> None:
    policy = CheckpointPolicy(Config(dirpath="x"), lambda c, est, elapsed: IntervalChoice(7, 0.7, "custom"))
    assert policy.explain().startswith("no interval yet")
    policy.start(0.0)
    assert policy.decide(7, 1.0, READY, False).save
    assert policy.explain().startswith("7 steps") and "custom" in policy.explain()


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"total_steps": 0}, "total_steps", "at least 1"),
        ({"total_steps": 2.5}, "total_steps", "whole number"),
        ({"schedule": "front_loaded"}, "schedule", "mtbf"),
        ({"overhead_budget": "150%"}, "overhead_budget", "below 100%"),
    ],
)
def test_policy_config_errors_name_field_value_and_fix(kwargs, field, words) -> None:
    with pytest.raises(ConfigError) as info:
        Config(dirpath="x", **kwargs)
    assert info.value.field == field and words in str(info.value) and "Fix:" in str(info.value)


def test_session_builds_front_loaded_schedule_and_feeds_it_losses(tmp_path) -> None:
    cfg = Config(dirpath=str(tmp_path), mtbf="1h", schedule="front_loaded", adaptive=False, total_steps=100)
    clock = iter(range(10**6)).__next__
    session = CheckpointSession(cfg, framework="np", suffix=".bin", clock=lambda: float(clock()),
                                storage=LocalStorage(tmp_path, fsync=False))
    (sched,) = session.policy.adjusters
    assert isinstance(sched, FrontLoadedSchedule) and sched.total_steps == 100
    session.start(0)
    for step in range(1, 41):
        session.step_end(step, loss=1.0 / step if step % 2 else None)
    assert sched.tracker.samples == 20  # only the steps that reported a loss


def test_explicit_adjusters_replace_the_config_ones(tmp_path) -> None:
    custom = [Recorder([], "x", 1)]
    session = CheckpointSession(Config(dirpath=str(tmp_path)), framework="np", suffix=".bin", interval_adjuster=custom)
    assert session.policy.adjusters == custom
