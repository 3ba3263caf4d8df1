"""ProcessGroup: a failure on any process is raised on every process (its own error where it
happened, the peer error with its message elsewhere); the agreement over real concurrent
callers (threads standing in for processes)."""

from __future__ import annotations

import pytest

from autockpt_core.policy.agreement import Agreement
from autockpt_core.policy.process_group import AGREED, PeerFailedError, ProcessGroup
from autockpt_core.policy.rank_timing import RankTimes
from tests.collectives import ThreadGather, ThreadGroup, on_threads


def test_one_process_raises_its_own_error_and_passes_without_one() -> None:
    group = ProcessGroup()
    assert group.writes and group.count == 1
    group.raise_if_any_failed(None)
    error = ValueError("disk full")
    with pytest.raises(ValueError) as raised:
        group.raise_if_any_failed(error)
    assert raised.value is error


@pytest.mark.parametrize(
    "count, failing, reported",
    [
        (2, [], None),
        (2, [0], 0),
        (2, [1], 1),
        (3, [0, 2], 2),  # several: the highest-numbered one's message goes to all
        (4, [1], 1),
    ],
)
def test_a_failure_on_any_process_is_raised_on_every_process(count: int, failing: list[int], reported: int | None) -> None:
    gather = ThreadGather(count)
    errors = {i: OSError(f"no space on process {i}") for i in failing}

    def run(i: int) -> None:
        ThreadGroup(i, gather).raise_if_any_failed(errors.get(i))

    results = on_threads(count, run)
    if reported is None:
        assert results == [None] * count
        return
    for i, result in enumerate(results):
        assert getattr(result, AGREED) is True
        if i in errors:
            assert result is errors[i]  # its own exception, traceback and all
        else:
            assert isinstance(result, PeerFailedError)
            assert str(result) == (
                f"autockpt: process {reported} stopped training, so every process stops: "
                f"OSError: no space on process {reported}"
            )


def test_an_error_every_process_already_agreed_on_is_raised_without_another_round() -> None:
    group = ThreadGroup(0, ThreadGather(2))  # a second round would wait for process 1 and time out
    error = PeerFailedError("agreed before")
    setattr(error, AGREED, True)
    with pytest.raises(PeerFailedError) as raised:
        group.raise_if_any_failed(error)
    assert raised.value is error


def test_the_agreement_is_the_same_on_every_process() -> None:
    gather = ThreadGather(3)
    signals = {0: None, 1: 15, 2: None}
    results = on_threads(3, lambda i: ThreadGroup(i, gather).agree(save=i == 0 or i == 2, signum=signals[i]))
    assert all(r == results[0] for r in results)
    assert results[0].save and results[0].signum == 15 and results[0].failed_rank is None


def test_settle_in_one_process_raises_the_error_or_returns_its_own_report() -> None:
    group = ProcessGroup()
    agreed = group.settle(None, save=True, signum=15, times=RankTimes(0.5, 0.25))
    assert agreed == Agreement(save=True, unclean=False, signum=15, failed_rank=None, slowest=RankTimes(0.5, 0.25))
    error = OSError("disk full")
    with pytest.raises(OSError) as raised:
        group.settle(error, save=True)
    assert raised.value is error


def test_settle_over_processes_agrees_and_raises_a_failure_everywhere() -> None:
    gather = ThreadGather(2)
    results = on_threads(2, lambda i: ThreadGroup(i, gather).settle(None, save=i == 0, signum=10 if i else None))
    assert results[0] == results[1] and results[0].save and results[0].signum == 10
    error = OSError("no space")
    failed = on_threads(2, lambda i: ThreadGroup(i, gather).settle(error if i == 1 else None, save=True))
    assert failed[1] is error and isinstance(failed[0], PeerFailedError) and "OSError: no space" in str(failed[0])
