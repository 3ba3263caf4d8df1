"""The door to a framework's private names: lookups, the report at a fit's start, the undo stack."""

from __future__ import annotations

import logging
import threading
import warnings

import pytest

from autockpt_core import AutockptError, ResumeNotExactWarning
from autockpt_core.internals_door import MISSING, Internal, PatchStack, absent, lookup, report_missing

TABLE = {
    "counter": Internal("Loop", "_counter", "the position in the data"),
    "connector": Internal("Trainer", "_connector", "writing checkpoints", required=True),
    "notifier": Internal("Signals", "_notifier", "taking SIGTERM over", exactness=False),
}


class Loop:
    def __init__(self) -> None:
        self._counter = 3


class Trainer:
    _connector = "class attribute"

    def method(self) -> str:
        return "the class's"


def test_lookup_gives_the_value_or_missing() -> None:
    assert lookup(TABLE, Loop(), "counter") == 3
    assert lookup(TABLE, object(), "counter") is MISSING
    assert lookup(TABLE, None, "counter") is MISSING  # a module that did not import


def test_absent_lists_the_entries_their_holders_lack() -> None:
    gone = absent(TABLE, [(Loop(), ("counter",)), (Trainer(), ("connector", "notifier"))])
    assert gone == [TABLE["notifier"]]


def test_nothing_missing_reports_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report_missing([], "Torch 9.9")
    assert not caplog.records


def test_a_missing_required_name_is_an_error_naming_it_and_the_release() -> None:
    with pytest.raises(AutockptError, match=r"cannot run on Lightning 9\.9: it has no Trainer\._connector \(writing"):
        report_missing([TABLE["counter"], TABLE["connector"]], "Lightning 9.9")


@pytest.mark.parametrize(
    "gone, warned, logged",
    [
        ([TABLE["counter"]], ["Loop._counter: the position in the data"], []),
        ([TABLE["notifier"]], [], ["Signals._notifier"]),
        ([TABLE["counter"], TABLE["notifier"], TABLE["counter"]], ["Loop._counter"], ["Signals._notifier"]),
    ],
)
def test_other_missing_names_are_one_warning_or_a_log_line(
    gone: list[Internal], warned: list[str], logged: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="autockpt"):
        warnings.simplefilter("always")
        report_missing(gone, "Keras 9.9 (tensorflow)")
    told = [str(w.message) for w in caught if issubclass(w.category, ResumeNotExactWarning)]
    assert len(told) == (1 if warned else 0)
    for name in warned:
        assert name in told[0] and "Keras 9.9 (tensorflow)" in told[0] and "Fix:" in told[0]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(logged) and all(any(n in line for line in lines) for n in logged)


# -- the patch stack ---------------------------------------------------------------------------


def test_a_swapped_instance_attribute_is_put_back() -> None:
    loop, patches = Loop(), PatchStack()
    patch = patches.set(loop, "_counter", 10)
    assert loop._counter == 10 and len(patches) == 1
    patches.undo(patch)
    assert loop._counter == 3 and len(patches) == 0
    patches.undo(patch)  # twice: nothing
    assert loop._counter == 3


def test_a_swap_over_a_class_attribute_is_removed_so_the_class_shows_again() -> None:
    trainer, patches = Trainer(), PatchStack()
    patches.set(trainer, "method", lambda: "the wrapper's")
    patches.set(trainer, "_connector", "instance")
    assert trainer.method() == "the wrapper's" and trainer._connector == "instance"
    patches.undo_all()
    assert trainer.method() == "the class's" and "method" not in vars(trainer)
    assert trainer._connector == "class attribute" and "_connector" not in vars(trainer)


def test_a_swap_someone_replaced_since_is_left_as_they_left_it() -> None:
    loop, patches = Loop(), PatchStack()
    patch = patches.set(loop, "_counter", 10)
    loop._counter = 11  # e.g. the framework rebuilt it
    patches.undo(patch)
    assert loop._counter == 11


def test_undo_all_goes_back_in_reverse_order() -> None:
    loop, patches = Loop(), PatchStack()
    patches.set(loop, "_counter", 10)
    patches.set(loop, "_counter", 20)
    patches.undo_all()
    assert loop._counter == 3 and len(patches) == 0


def test_undo_none_is_a_no_op() -> None:
    PatchStack().undo(None)


def test_a_swap_ended_on_another_thread_while_the_fit_ends_is_put_back_once() -> None:
    trainer, patches = Trainer(), PatchStack()
    patches_made = [patches.set(trainer, "method", lambda: "w")]
    done = threading.Event()

    def loader_thread() -> None:
        for _ in range(1000):
            patches.undo(patches_made[0])
        done.set()

    thread = threading.Thread(target=loader_thread)
    thread.start()
    patches.undo_all()
    thread.join()
    assert done.is_set() and trainer.method() == "the class's" and len(patches) == 0
