"""A blocking call with a deadline on its progress (``autockpt_core.persist.watched_call``)."""

from __future__ import annotations

import threading
import time

import pytest

from autockpt_core.persist.watched_call import CallStalled, Progress, call_watched


def test_a_call_that_returns_gives_its_result_and_one_that_raises_its_error() -> None:
    assert call_watched(lambda progress: 42, stall_s=5, what="a call") == 42
    with pytest.raises(KeyError, match="missing"):
        call_watched(lambda progress: {}["missing"], stall_s=5, what="a call")


def test_a_call_that_keeps_moving_is_waited_for_past_the_stall_timeout() -> None:
    def slow_but_moving(progress: Progress) -> str:
        for _ in range(8):
            time.sleep(0.1)
            progress.mark()
        return "done"

    start = time.monotonic()
    assert call_watched(slow_but_moving, stall_s=0.35, what="a copy") == "done"
    assert time.monotonic() - start >= 0.8


def test_a_call_that_stops_moving_is_abandoned_and_told_so() -> None:
    release = threading.Event()
    seen: list[bool] = []

    def hangs(progress: Progress) -> None:
        release.wait(10)  # a hung mount
        seen.append(progress.abandoned)

    start = time.monotonic()
    with pytest.raises(CallStalled, match=r"upload of x made no progress for [0-9.]+s \(stall timeout 0.3s\)"):
        call_watched(hangs, stall_s=0.3, what="upload of x")
    assert time.monotonic() - start < 2
    release.set()
    for _ in range(100):
        if seen:
            break
        time.sleep(0.01)
    assert seen == [True]  # when it comes back, it knows not to list anything


def test_stop_ends_the_wait_early() -> None:
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(CallStalled, match="was abandoned"):
        call_watched(lambda progress: time.sleep(5), stall_s=60, what="upload of y", stop=stop.is_set)
