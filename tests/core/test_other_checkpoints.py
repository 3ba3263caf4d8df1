"""The framework's own saves and loads beside autockpt's (:mod:`autockpt_core.other_checkpoints`)."""

from __future__ import annotations

import warnings

import pytest

from autockpt_core import ResumeNotExactWarning, RunSummary
from autockpt_core.other_checkpoints import OtherCheckpoints


class Model:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def save(self, path: str) -> str:
        self.calls.append(f"save {path}")
        return path

    def load(self, path: str) -> None:
        self.calls.append(f"load {path}")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.25  # each reading a quarter second later: a save takes 0.25 s
        return self.now


def test_saves_are_counted_and_timed_and_release_puts_the_class_method_back() -> None:
    model, others = Model(), OtherCheckpoints(clock=Clock())
    others.watch(model, saves=("save",), what="a ModelCheckpoint")
    assert model.save("a") == "a" and model.save("b") == "b"
    assert (others.saves, others.save_s, model.calls) == (2, 0.5, ["save a", "save b"])
    others.release()
    assert "save" not in vars(model) and model.save("c") == "c" and others.saves == 2


def test_a_wrapper_left_by_a_fit_that_raised_is_replaced_not_stacked() -> None:
    model, first, second = Model(), OtherCheckpoints(), OtherCheckpoints()
    first.watch(model, saves=("save",))  # never released
    second.watch(model, saves=("save",))
    model.save("x")
    assert (first.saves, second.saves) == (0, 1)
    second.release()
    assert "save" not in vars(model)


def test_an_instances_own_method_is_put_back_as_it_was() -> None:
    model, others = Model(), OtherCheckpoints()
    own = lambda path: "own"  # noqa: E731
    model.save = own  # type: ignore[method-assign]
    others.watch(model, saves=("save",))
    assert model.save("p") == "own" and others.saves == 1
    others.release()
    assert vars(model)["save"] is own


@pytest.mark.parametrize("resumed, warns", [(None, False), (12, True)])
def test_a_load_after_the_resume_warns_that_it_replaced_the_resumed_state(resumed, warns) -> None:
    model, others = Model(), OtherCheckpoints()
    others.watch(model, loads=("load",), resumed=lambda: resumed)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.load("backup.weights.h5")
    assert model.calls == ["load backup.weights.h5"]
    said = [str(w.message) for w in seen if w.category is ResumeNotExactWarning]
    assert bool(said) is warns
    if warns:
        assert "load('backup.weights.h5') ran after autockpt resumed step 12" in said[0]
        assert "remove BackupAndRestore" in said[0]


@pytest.mark.parametrize("saves, text", [(0, None), (1, "; beside it, X saved 1 time in 400ms"),
                                          (3, "; beside it, X saved 3 times in 400ms")])
def test_the_summary_line_reports_the_other_saves(saves, text) -> None:
    summary = RunSummary(framework="np", checkpoints=3, mean_stall_s=0.01, checkpoint_bytes=1000, overhead=0.015,
                         budget=0.02, interval_steps=10, interval_rule="every_n_steps", newest_step=30,
                         newest_path="x", other_saves=saves, other_save_s=0.4, other_what="X")
    assert summary.line().endswith("-> x" + (text or ""))
