"""SortedWindow: every figure equals the plain computation over the same values, whatever the
sequence of appends, replacements and clears."""

from __future__ import annotations

import math
import statistics
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autockpt_core.policy.sorted_window import SortedWindow
from autockpt_core.policy.stats import mean_sd

durations = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), durations),
        st.tuples(st.just("replace_last"), durations),
        st.tuples(st.just("clear"), st.just(0.0)),
    ),
    max_size=120,
)


def _check(window: SortedWindow, reference: deque[float], cap: float) -> None:
    assert list(window) == list(reference)
    assert len(window) == len(reference)
    if not reference:
        assert window.median() is None and window.median_abs_deviation() is None
        assert window.capped_mean_sd(cap) is None and window.mean_sd_below(cap) is None
        return
    center = statistics.median(reference)
    assert window.median() == center
    assert window.median_abs_deviation() == statistics.median(abs(v - center) for v in reference)
    assert window.capped_mean_sd(cap) == mean_sd([min(v, cap) for v in reference])
    below = sorted(v for v in reference if v <= cap)
    assert window.mean_sd_below(cap) == ((*mean_sd(below), len(below)) if below else None)
    assert window.last == reference[-1]


@settings(max_examples=300, deadline=None)
@given(maxlen=st.integers(1, 9), ops=operations, cap=st.floats(min_value=0.5, max_value=20.0))
def test_every_figure_equals_the_plain_computation(maxlen: int, ops: list[tuple[str, float]], cap: float) -> None:
    window, reference = SortedWindow(maxlen), deque[float](maxlen=maxlen)
    for op, value in ops:
        if op == "append":
            window.append(value)
            reference.append(value)
        elif op == "replace_last" and reference:
            window.replace_last(value)
            reference[-1] = value
        elif op == "clear":
            window.clear()
            reference.clear()
        _check(window, reference, cap)  # read after every change: the kept figures are renewed


@pytest.mark.parametrize(
    ("values", "median", "mad"),
    [
        ([3.0], 3.0, 0.0),
        ([1.0, 3.0], 2.0, 1.0),
        ([5.0, 1.0, 2.0, 2.0, 9.0], 2.0, 1.0),
        ([0.1, 0.1, 0.1, 0.1], 0.1, 0.0),
    ],
)
def test_median_and_its_absolute_deviation(values: list[float], median: float, mad: float) -> None:
    window = SortedWindow(len(values))
    for value in values:
        window.append(value)
    assert window.median() == median
    assert math.isclose(window.median_abs_deviation() or 0.0, mad, abs_tol=1e-12)


def test_the_oldest_value_leaves_a_full_window() -> None:
    window = SortedWindow(3)
    for value in (9.0, 1.0, 2.0, 3.0):
        window.append(value)
    assert list(window) == [1.0, 2.0, 3.0]
    assert window.median() == 2.0


def test_values_at_the_cap_are_capped_above_it() -> None:
    window = SortedWindow(4)
    for value in (1.0, 1.0, 1.0, 100.0):
        window.append(value)
    assert window.capped_mean_sd(5.0) == mean_sd([1.0, 1.0, 1.0, 5.0])
    assert window.capped_mean_sd(1000.0) == mean_sd([1.0, 1.0, 1.0, 100.0])


def test_a_window_needs_room_for_one_value() -> None:
    with pytest.raises(ValueError, match="maxlen must be >= 1, got 0"):
        SortedWindow(0)
