"""FitWatch: releases a fit() that left without on_train_end, and holds none of its frames.

A frame the watch thread still referenced while it waited could be the last reference to a
finished ``fit()``'s locals (a TensorFlow iterator among them); they would then be freed in
the watch's daemon thread while the interpreter finalizes, where TensorFlow aborts the
process (seen after a SIGTERM under MirroredStrategy, exit -6 instead of 143).
"""

from __future__ import annotations

import sys
import threading
import weakref
from types import FrameType
from typing import Any, Callable

import pytest

from autockpt_keras import fit_watch
from autockpt_keras.fit_watch import FitWatch


class Sentinel:
    pass


class GatedStacks:
    """Stands in for ``sys`` in the watch module: from the second look at the threads' stacks
    on, the watch thread waits at the start of its look until ``gate`` is set."""

    def __init__(self) -> None:
        self.looks = 0
        self.second_look = threading.Event()
        self.gate = threading.Event()

    def _current_frames(self) -> dict[int, FrameType]:
        self.looks += 1
        if self.looks >= 2:
            self.second_look.set()
            assert self.gate.wait(30), "the test never opened the gate"
        return sys._current_frames()


def test_between_looks_the_watch_holds_no_frame_of_the_training_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    stacks = GatedStacks()
    monkeypatch.setattr(fit_watch, "sys", stacks)
    gone: list[str] = []

    def inner() -> weakref.ref[Sentinel]:
        sentinel = Sentinel()
        # the first look sees this frame on top; the second waits at its start
        assert stacks.second_look.wait(30), "the watch never looked twice"
        return weakref.ref(sentinel)

    def fit() -> tuple[FitWatch, weakref.ref[Sentinel]]:
        watch = FitWatch(sys._getframe(), threading.get_ident(), lambda: gone.append("gone"), interval=0.01)
        watch.start()
        return watch, inner()

    watch, ref = fit()
    try:
        assert ref() is None, "the watch thread still holds the frame it looked at (and its locals)"
    finally:
        stacks.gate.set()
        watch.stop()
    assert gone == []  # stopped before its look found fit() gone


def watched_call(interval: float, body: Callable[[FitWatch], Any], on_gone: Callable[[], None]) -> FitWatch:
    def fit() -> FitWatch:
        watch = FitWatch(sys._getframe(), threading.get_ident(), on_gone, interval=interval)
        watch.start()
        body(watch)
        return watch

    return fit()


def test_a_fit_that_left_without_stop_is_released_once_and_the_warning_names_where(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="autockpt")
    released = threading.Event()
    calls: list[int] = []

    def on_gone() -> None:
        calls.append(1)
        released.set()

    watch = watched_call(0.01, lambda w: None, on_gone)
    assert released.wait(30)
    watch.stop()
    assert calls == [1]
    assert "fit() left the training thread without on_train_end (its stack is now at wait (" in caplog.text


def test_stop_while_fit_runs_means_on_gone_is_never_called() -> None:
    calls: list[int] = []
    watch = watched_call(0.01, lambda w: w.stop(), lambda: calls.append(1))
    watch._thread.join(30)
    assert not watch._thread.is_alive() and calls == []
