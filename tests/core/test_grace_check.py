"""The grace period: the mirror's share of it in an emergency, and the warning when a measured
checkpoint would not fit it (``autockpt_core.grace_check``, ``autockpt_core.emergency``)."""

from __future__ import annotations

import warnings

import pytest

from autockpt_core import Config
from autockpt_core.grace_check import EXIT_MARGIN_S, GraceCheck, mirror_wait
from autockpt_core.policy import Estimates


@pytest.mark.parametrize(
    ("config", "elapsed", "wait"),
    [
        ({}, 0.4, 27.6),  # 30 s, 0.4 s used, 2 s kept to exit
        ({"grace_period": "8s"}, 1.0, 5.0),
        ({"grace_period": "8s"}, 7.5, 0.0),  # nothing left: the local checkpoint must do
        ({"grace_period": "8s", "mirror_preempt_wait": "60s"}, 1.0, 60.0),  # set by the user: as set
    ],
)
def test_the_mirror_waits_for_what_is_left_of_the_grace_period(config: dict, elapsed: float, wait: float) -> None:
    cfg = Config(dirpath="ck", **config)
    assert mirror_wait(cfg.grace_period, cfg.mirror_preempt_wait, elapsed) == pytest.approx(wait)
    assert EXIT_MARGIN_S == 2.0


@pytest.mark.parametrize(
    ("stall", "persist", "grace", "warns"),
    [(0.1, 5.0, 30.0, False), (0.5, 28.0, 30.0, True), (None, 50.0, 30.0, False), (0.2, None, 30.0, False),
     (1.0, 6.5, 9.0, True), (1.0, 6.5, 9.5, False)],  # with 2 s to exit: 9.5 s needed
)
def test_a_checkpoint_that_would_not_fit_is_warned_once_with_the_numbers(
    stall: float | None, persist: float | None, grace: float, warns: bool
) -> None:
    check, calls = GraceCheck(grace), []

    def estimates() -> Estimates:
        calls.append(1)
        return Estimates(stall_s=stall, persist_s=persist)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [check.check(estimates) for _ in range(3)] == [warns, False, False]
    assert len(caught) == (1 if warns else 0)
    if warns:
        message = str(caught[0].message)
        assert f"grace_period={grace:g} s" in message and f"{stall + persist:.1f} s" in message  # type: ignore[operator]
        assert "terminationGracePeriodSeconds" in message and caught[0].category is RuntimeWarning
        assert len(calls) == 1  # not read again once warned
    else:
        assert len(calls) == 3


def test_grace_period_is_a_positive_duration() -> None:
    assert Config(dirpath="ck", grace_period="2min").grace_period == 120.0
    assert Config(dirpath="ck").mirror_preempt_wait is None
    for bad in ("soon", 0, -5):
        with pytest.raises(Exception, match="grace_period"):
            Config(dirpath="ck", grace_period=bad)
