"""autockpt_bench.workers.study_common: the figures a study worker reports from its timeline."""

import pytest

from autockpt_bench.workers.study_common import Timeline


def test_the_hooks_fixed_cost_is_reported_and_taken_out_of_each_checkpoints_blocked_time() -> None:
    timeline = Timeline()
    for step in range(1, 21):
        timeline.step_done(step)
        timeline.add_hook_time(step, 0.005 if step == 10 else 0.0002)  # a checkpoint after step 10
    timeline.checkpoint(10, save_s=0.05)
    figures = timeline.figures(warmup=2)
    assert figures["hook_s_median"] == pytest.approx(0.0002)
    assert figures["blocked_s"] == [pytest.approx(0.0048)]  # step 11's hooks paid only the fixed cost
    assert figures["checkpoint_steps"] == [10] and figures["save_s"] == [0.05]


def test_a_run_without_hooks_has_no_hook_cost() -> None:
    timeline = Timeline()
    for step in range(1, 6):
        timeline.step_done(step)
    assert timeline.figures(warmup=1)["hook_s_median"] is None
