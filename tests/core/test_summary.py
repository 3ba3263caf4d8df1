"""The end-of-training summary line: what it says about the interval."""

from __future__ import annotations

import pytest

from autockpt_core import RunSummary

DENSEST = "the densest the budget allows without an mtbf; min_interval or mtbf for fewer"


@pytest.mark.parametrize(
    "rule, mtbf_s, noted",
    [
        ("budget", None, True),
        ("persist", None, True),
        ("adaptive:budget", None, True),
        ("budget", 3600.0, False),  # told the MTBF: the budget only caps Daly's interval
        ("daly", 3600.0, False),
        ("every_n_steps", None, False),  # the user's own interval
        ("min_interval", None, False),
    ],
)
def test_an_interval_set_by_the_budget_alone_says_it_is_the_densest_and_what_to_set(rule, mtbf_s, noted) -> None:
    summary = RunSummary(framework="np", checkpoints=3, mean_stall_s=0.01, checkpoint_bytes=1000, overhead=0.015,
                         budget=0.02, interval_steps=10, interval_rule=rule, newest_step=30, newest_path="x",
                         mtbf_s=mtbf_s)
    assert (f"interval 10 steps ({rule}, {DENSEST})" in summary.line()) is noted
    assert f"interval 10 steps ({rule}" in summary.line()
