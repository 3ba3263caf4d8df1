"""FitDriver: the cross-process protocol of one fit(), on fake sessions, with threads standing in
for processes (tests/collectives.py). No framework: every input is a value or a callable."""

from __future__ import annotations

import logging
import math
import signal
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest

from autockpt_core import Config, Preempted, RunSummary
from autockpt_core.checkpoint_event import CheckpointEvent
from autockpt_core.fit_driver import FINAL_REASON, PREPARATION_WAIT_S, Due, FitDriver
from autockpt_core.persist import CheckpointRecord
from autockpt_core.checkpoint_store import EmergencyCommit
from autockpt_core.policy.decision import Decision
from autockpt_core.policy.process_group import PeerFailedError, ProcessGroup
from tests.collectives import ThreadGather, ThreadGroup, on_threads

TERM = int(signal.SIGTERM)


class FakeStore:
    """The session's checkpoint store at a preemption: nothing in flight, no record, no mirror."""

    def commit_emergency(self, since: float, on_durable: Callable[[float], None]) -> EmergencyCommit:
        on_durable(0.0)
        return EmergencyCommit(None, None, 0.0)


class FakeStatus:
    """The session's status file: the preemptions it was told (step, seconds from the signal)."""

    def __init__(self) -> None:
        self.preemptions: list[tuple[int, float]] = []

    def preempted(self, step: int, signal_to_durable_s: float) -> None:
        self.preemptions.append((step, signal_to_durable_s))


class FakeSession:
    """Decides to save at the steps in ``due`` (step → reason); records what the driver did."""

    def __init__(self, config: Config, due: dict[int, str] | None = None, fail_at: int | None = None) -> None:
        self.config = config
        self.due = due or {}
        self.fail_at = fail_at
        self.started: list[int] = []
        self.losses: list[float | None] = []
        self.finished = 0
        self.waited_for_mirror: list[bool] = []
        self.finish_error: Exception | None = None
        self.record: CheckpointRecord | None = None
        self.store = FakeStore()
        self.storage = None
        self.mirror = None
        self.last_decision: Decision | None = None
        self.hook_times: list[float] = []
        self.prefaulting: set[int] = set()  # steps whose decision finds the buffers' prefault running
        self.step = 0
        self.recorded: list[list[int]] = []  # the steps of each record_steps call
        self.next_step: int | None = None
        self.clock = time.perf_counter
        self.statuses: list[tuple[str, int]] = []  # report_status calls (the emergency's "preempted")
        self.status = FakeStatus()

    def preparing(self) -> bool:
        return self.step in self.prefaulting

    def report_status(self, state: str, step: int) -> None:
        self.statuses.append((state, step))

    def hook_time(self, seconds: float, steps: int = 1) -> None:
        self.hook_times.append(seconds)

    def start(self, step: int) -> None:
        self.started.append(step)

    def expect_end(self, step: int | None) -> None:
        self.expected_end = step

    def record_steps(self, steps: list[int], ends: list[float], losses: list[float | None] | None = None) -> None:
        self.recorded.append(list(steps))
        if self.fail_at in steps:
            raise OSError(f"disk full at step {self.fail_at}")
        self.losses.extend(losses if losses is not None else [None] * len(steps))
        self.step = steps[-1]

    def decide(self, step: int, now: float) -> Decision:
        """Save at the steps in ``due``; ask again at the next one (``next_step`` None), unless
        ``next_step`` gives the step to ask at."""
        reason = self.due.get(step)
        self.last_decision = Decision(save=reason is not None, reason=reason or "", next_step=self.next_step)
        return self.last_decision

    def combine_ranks(self, slowest: Any) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {"autockpt/checkpoints": 0.0}

    def resume_record(self) -> CheckpointRecord | None:
        return self.record

    def finish(self, wait_for_mirror: bool = True) -> RunSummary:
        self.finished += 1
        self.waited_for_mirror.append(wait_for_mirror)
        if self.finish_error is not None:
            raise self.finish_error
        return RunSummary("fake", 0, None, None, None, 0.02, None, None, None, None)


class FakeSignal:
    """What the driver reads of a PreemptionHandler: ``signum`` and ``clear()``."""

    def __init__(self, signum: int | None = None) -> None:
        self.signum = signum

    def clear(self) -> None:
        self.signum = None


class Taker:
    """The adapter's ``take``: records every Due; ``fail``: raise on these steps."""

    def __init__(self, fail: tuple[int, ...] = ()) -> None:
        self.dues: list[Due] = []
        self.fail = fail

    def __call__(self, due: Due) -> CheckpointEvent | None:
        if due.step in self.fail:
            raise MemoryError(f"no room for the buffers at step {due.step}")
        self.dues.append(due)
        return CheckpointEvent(due.step, 0, due.reason, None, None, 0.0, 0)

    @property
    def taken(self) -> list[tuple[int, str]]:
        return [(d.step, d.reason) for d in self.dues]


def make(
    tmp_path: Path,
    due: dict[int, str] | None = None,
    *,
    group: ProcessGroup | None = None,
    writes: bool = True,
    signum: int | None = None,
    on_preempt: str = "exit",
    signals_wait: bool = False,
    save_on_train_end: bool = True,
    verbose: bool = False,
    fail_take: tuple[int, ...] = (),
) -> tuple[FitDriver, FakeSession, Taker, FakeSignal]:
    config = Config(dirpath=str(tmp_path), on_preempt=on_preempt, verbose=verbose)
    session = FakeSession(config, due)
    taker = Taker(fail_take)
    handler = FakeSignal(signum)
    driver = FitDriver(
        config, group or ProcessGroup(), session if writes else None, taker,  # type: ignore[arg-type]
        save_on_train_end=save_on_train_end, preemption=handler, signals_wait=signals_wait,  # type: ignore[arg-type]
        nothing_left=lambda: "autockpt: nothing left to train",
    )  # fmt: skip
    return driver, session, taker, handler


def run_steps(
    driver: FitDriver,
    steps: range,
    unclean: tuple[int, ...] = (),
    losses: dict[int, float] | None = None,
    asked: list[int] | None = None,
) -> None:
    """``asked``: pass ``unclean`` as a function that notes the steps it was called at."""
    for step in steps:
        if asked is None:
            driver.step_end(step, loss=(losses or {}).get(step, 1.0), unclean=step in unclean)
            continue

        def is_unclean(step: int = step) -> bool:
            asked.append(step)
            return step in unclean

        driver.step_end(step, loss=(losses or {}).get(step, 1.0), unclean=is_unclean)


# -- one process: decisions, deferral, the final checkpoint --------------------------------------


@pytest.mark.parametrize(
    "due, unclean, expected",
    [
        ({3: "interval"}, (), [(3, "interval")]),
        ({3: "interval", 6: "interval"}, (), [(3, "interval"), (6, "interval")]),
        # due at an unclean boundary: the next step, saying so
        ({3: "interval"}, (3,), [(4, "interval (deferred from step 3)")]),
        # deferred once only: the next boundary takes it even when unclean too
        ({3: "interval"}, (3, 4), [(4, "interval (deferred from step 3)")]),
        # the next step was due anyway: its own reason
        ({3: "interval", 4: "budget"}, (3,), [(4, "budget")]),
        # unclean with nothing due: nothing happens
        ({}, (2, 3), []),
    ],
)
def test_step_end_takes_what_is_due_and_defers_it_past_an_unclean_boundary(
    tmp_path: Path, due: dict[int, str], unclean: tuple[int, ...], expected: list[tuple[int, str]]
) -> None:
    driver, _, taker, _ = make(tmp_path, due, save_on_train_end=False)
    driver.begin(0)
    run_steps(driver, range(1, 7), unclean)
    assert taker.taken == expected
    assert [e.step for e in driver.events] == [s for s, _ in expected]

    lazy, _, lazy_taker, _ = make(tmp_path, due, save_on_train_end=False)
    lazy.begin(0)
    asked: list[int] = []
    run_steps(lazy, range(1, 7), unclean, asked=asked)
    assert lazy_taker.taken == expected  # the same decisions, with the boundary asked about
    assert asked == sorted(due)  # only where a checkpoint was due


def test_a_deferral_taken_at_a_boundary_keeps_its_reason_and_step(tmp_path: Path) -> None:
    """Keras: due at an epoch's last batch (step 5), taken at the next epoch's start."""
    driver, _, taker, _ = make(tmp_path, {5: "interval"})
    driver.begin(0)
    run_steps(driver, range(1, 6), unclean=(5,))
    assert taker.taken == []
    driver.boundary(5)
    assert taker.taken == [(5, "interval")] and driver.saved_step == 5
    driver.boundary(5)  # nothing pending any more
    assert len(taker.dues) == 1


@pytest.mark.parametrize(
    "save_on_train_end, due, unclean, end_step, losses, expected",
    [
        (True, {3: "interval"}, (), 5, {}, [(3, "interval"), (5, FINAL_REASON)]),
        (True, {5: "interval"}, (), 5, {}, [(5, "interval")]),  # the newest holds this step
        (False, {3: "interval"}, (), 5, {}, [(3, "interval")]),
        # a deferral still pending at the end is taken, with its reason (save_on_train_end=False)
        (False, {5: "interval"}, (5,), 5, {}, [(5, "interval")]),
        (True, {5: "interval"}, (5,), 5, {}, [(5, FINAL_REASON)]),
        (True, {3: "interval"}, (), 5, {5: math.nan}, [(3, "interval")]),  # not finite: none
        (True, {3: "interval"}, (), 5, {5: math.inf}, [(3, "interval")]),
    ],
)
def test_final_checkpoint(
    tmp_path: Path,
    save_on_train_end: bool,
    due: dict[int, str],
    unclean: tuple[int, ...],
    end_step: int,
    losses: dict[int, float],
    expected: list[tuple[int, str]],
) -> None:
    driver, _, taker, _ = make(tmp_path, due, save_on_train_end=save_on_train_end)
    driver.begin(0)
    run_steps(driver, range(1, end_step + 1), unclean, losses)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        driver.final(end_step)
    assert taker.taken == expected
    nonfinite = [str(w.message) for w in caught if "no final checkpoint" in str(w.message)]
    assert len(nonfinite) == (1 if losses else 0)
    if losses:
        assert nonfinite[0].endswith("the newest checkpoint stays step 3")


@pytest.mark.parametrize(("save_on_train_end", "expected"), [(True, 120), (False, None)])
def test_the_planned_end_reaches_the_policy_only_with_a_final_checkpoint(
    tmp_path: Path, save_on_train_end: bool, expected: int | None
) -> None:
    driver, session, _, _ = make(tmp_path, save_on_train_end=save_on_train_end)
    driver.begin(0)
    driver.expect_end(120)
    assert session.expected_end == expected
    make(tmp_path, writes=False)[0].expect_end(120)  # a process without a session: nothing to tell


def test_final_checkpoint_records_whether_a_run_continues_exactly(tmp_path: Path) -> None:
    driver, _, taker, _ = make(tmp_path)
    driver.begin(0)
    run_steps(driver, range(1, 4))
    driver.final(3, unclean=True)
    assert taker.dues == [Due(3, FINAL_REASON, final=True, exact=False)]


def test_nothing_trained_takes_no_final_checkpoint_and_says_nothing_was_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    driver, session, taker, _ = make(tmp_path, verbose=True)
    driver.resumed(40)
    driver.begin(40)
    driver.final(40)
    driver.finish()
    driver.finish()  # once per fit
    assert taker.dues == [] and session.finished == 1
    assert capsys.readouterr().out == "autockpt: nothing left to train\n"


# -- signals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "signals_wait, unclean, expected",
    [
        (False, (), [(3, "preempted by SIGTERM")]),
        (True, (), [(3, "preempted by SIGTERM")]),
        (False, (3,), [(3, "preempted by SIGTERM")]),  # Keras: a signal checkpoints at once
        (True, (3,), [(4, "preempted by SIGTERM")]),  # Lightning: it waits for a clean step
    ],
)
def test_a_signal_commits_a_checkpoint_of_its_step_then_exits(
    tmp_path: Path, signals_wait: bool, unclean: tuple[int, ...], expected: list[tuple[int, str]]
) -> None:
    driver, session, taker, handler = make(tmp_path, signals_wait=signals_wait)
    driver.begin(0)
    run_steps(driver, range(1, 3))
    handler.signum = TERM
    asked: list[int] = []
    with pytest.raises(Preempted) as stopped:
        run_steps(driver, range(3, 6), unclean, asked=asked)
    assert taker.taken == expected
    assert asked == list(range(3, expected[0][0] + 1))  # a signal came: asked at every step until it ends
    assert (stopped.value.signum, stopped.value.step) == (TERM, expected[0][0])
    assert driver.preempted is not None and driver.preempted.step == expected[0][0]
    assert session.statuses == [("preempted", expected[0][0])]  # the status file says so, once committed
    assert [step for step, _ in session.status.preemptions] == [expected[0][0]]  # with the seconds it took


def test_a_signal_at_a_due_checkpoint_takes_one_checkpoint(tmp_path: Path) -> None:
    driver, _, taker, handler = make(tmp_path, {3: "interval"})
    driver.begin(0)
    run_steps(driver, range(1, 3))
    handler.signum = TERM
    with pytest.raises(Preempted):
        driver.step_end(3, loss=1.0)
    assert taker.taken == [(3, "interval")]


def test_on_preempt_continue_clears_the_signal_and_trains_on(tmp_path: Path) -> None:
    driver, _, taker, handler = make(tmp_path, on_preempt="continue")
    driver.begin(0)
    handler.signum = TERM
    run_steps(driver, range(1, 5))
    assert taker.taken == [(1, "preempted by SIGTERM")] and handler.signum is None


@pytest.mark.parametrize(
    "trained, resumed, expected",
    [
        (False, None, []),  # nothing trained: nothing to save
        (False, 7, []),  # the resumed checkpoint holds this step
        (True, None, [(2, "preempted by SIGTERM")]),
    ],
)
def test_a_signal_at_a_boundary(tmp_path: Path, trained: bool, resumed: int | None, expected: list[Any]) -> None:
    driver, _, taker, handler = make(tmp_path)
    if resumed is not None:
        driver.resumed(resumed)
    driver.begin(resumed or 0)
    if trained:
        run_steps(driver, range(1, 3))
    handler.signum = TERM
    with pytest.raises(Preempted):
        driver.boundary(resumed or (2 if trained else 0))
    assert taker.taken == expected


@pytest.mark.parametrize(
    "signal_at, resumed, expected",
    [
        (None, None, []),  # no signal: validation goes on
        (TERM, None, [(4, "preempted by SIGTERM")]),  # the last trained step, at once
        (TERM, 4, []),  # the resumed checkpoint holds that step: nothing to take, still the exit
    ],
)
def test_a_signal_outside_a_step_is_acted_on_at_once_on_one_process(
    tmp_path: Path, signal_at: int | None, resumed: int | None, expected: list[Any]
) -> None:
    """Validation between steps 4 and 5 (``outside_step`` at each validation batch): a signal
    that the deferral of an unclean step 4 held back is acted on there, not at step 5."""
    driver, session, taker, handler = make(tmp_path, signals_wait=True)
    if resumed is not None:
        driver.resumed(resumed)
    driver.begin(resumed or 0)
    if resumed is None:
        run_steps(driver, range(1, 4))
        handler.signum = signal_at
        run_steps(driver, range(4, 5), unclean=(4,))  # deferred: Lightning cannot resume exactly here
        assert taker.taken == []
    handler.signum = signal_at
    if signal_at is None:
        driver.outside_step(4)
        assert taker.taken == [] and driver.preempted is None
        return
    with pytest.raises(Preempted) as stopped:
        driver.outside_step(4)
    assert stopped.value.step == 4 and taker.taken == expected
    assert session.statuses[-1] == ("preempted", 4)


def test_several_processes_leave_a_signal_outside_a_step_to_the_next_step(tmp_path: Path) -> None:
    fits = drivers(tmp_path, 2)

    def fit(i: int) -> Any:
        driver, _, taker, handler = fits[i]
        driver.begin(0)
        driver.step_end(1, loss=1.0)
        if i == 1:
            handler.signum = TERM
        driver.outside_step(1)  # not a collective: the processes may call it a different number of times
        driver.step_end(2, loss=1.0)
        return taker.taken

    results = on_threads(2, fit)
    assert all(isinstance(r, Preempted) and r.step == 2 for r in results), results


def test_a_signal_after_the_last_step_ends_the_run_after_finish(tmp_path: Path) -> None:
    driver, session, taker, handler = make(tmp_path)
    driver.begin(0)
    run_steps(driver, range(1, 4))
    driver.final(3)
    handler.signum = TERM
    driver.finish()
    with pytest.raises(Preempted) as stopped:
        driver.end(3)
    assert stopped.value.step == 3 and taker.taken == [(3, FINAL_REASON)] and session.finished == 1


# -- failures --------------------------------------------------------------------------------------


def test_a_session_error_at_a_step_is_raised(tmp_path: Path) -> None:
    driver, session, _, _ = make(tmp_path)
    session.fail_at = 2
    driver.begin(0)
    with pytest.raises(OSError, match="disk full at step 2"):
        run_steps(driver, range(1, 4))


def test_abandon_logs_the_persist_error_and_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    driver, session, _, _ = make(tmp_path)
    session.finish_error = OSError("the last persist failed")
    driver.begin(0)
    with caplog.at_level(logging.ERROR, logger="autockpt"):
        driver.abandon()
        driver.abandon()
    driver.finish()  # after abandon: nothing
    assert session.finished == 1 and session.waited_for_mirror == [False]  # training failed: no wait
    assert "the last persist failed" in caplog.text


def test_finish_raises_the_last_persist_error(tmp_path: Path) -> None:
    driver, session, _, _ = make(tmp_path)
    session.finish_error = OSError("the last persist failed")
    driver.begin(0)
    with pytest.raises(OSError, match="the last persist failed"):
        driver.finish()


# -- several processes (threads) -------------------------------------------------------------------


def drivers(tmp_path: Path, count: int, **kwargs: Any) -> list[tuple[FitDriver, FakeSession, Taker, FakeSignal]]:
    gather = ThreadGather(count)
    return [make(tmp_path, group=ThreadGroup(i, gather), writes=i == 0, **kwargs) for i in range(count)]


def test_process_0_decides_and_every_process_takes_the_checkpoint(tmp_path: Path) -> None:
    fits = drivers(tmp_path, 3, due={2: "interval"})

    def fit(i: int) -> list[tuple[int, str]]:
        driver, _, taker, _ = fits[i]
        driver.begin(0)
        asked: list[int] = []
        run_steps(driver, range(1, 4), unclean=(2,) if i == 0 else (), asked=asked)  # process 0's view counts
        assert asked == [1, 2, 3]  # several processes: asked at every step, for the collective
        driver.final(3)
        driver.finish()
        return taker.taken

    results = on_threads(3, fit)
    # the reason is process 0's: it decides
    assert results == [[(3, "interval (deferred from step 2)")], [(3, "")], [(3, "")]]
    assert [len(f[0].events) for f in fits] == [1, 1, 1]  # every Taker returned an event here


def test_a_signal_on_one_process_stops_every_process_at_the_same_step(tmp_path: Path) -> None:
    fits = drivers(tmp_path, 2)

    def fit(i: int) -> Any:
        driver, _, taker, handler = fits[i]
        driver.begin(0)
        for step in range(1, 6):
            if i == 1 and step == 3:
                handler.signum = TERM
            driver.step_end(step, loss=1.0)
        return taker.taken

    results = on_threads(2, fit)
    assert all(isinstance(r, Preempted) and r.step == 3 for r in results), results
    assert [f[2].taken for f in fits] == [[(3, "preempted by SIGTERM")]] * 2


def test_one_process_failing_in_a_checkpoint_stops_every_process(tmp_path: Path) -> None:
    gather = ThreadGather(2)
    fits = [
        make(tmp_path, {2: "interval"}, group=ThreadGroup(0, gather), writes=True),
        make(tmp_path, {2: "interval"}, group=ThreadGroup(1, gather), writes=False, fail_take=(2,)),
    ]

    def fit(i: int) -> Any:
        driver = fits[i][0]
        driver.begin(0)
        run_steps(driver, range(1, 4))

    results = on_threads(2, fit)
    assert isinstance(results[1], MemoryError)
    assert isinstance(results[0], PeerFailedError)
    assert "process 1 stopped training" in str(results[0]) and "no room for the buffers" in str(results[0])


def test_a_session_error_on_process_0_stops_every_process(tmp_path: Path) -> None:
    fits = drivers(tmp_path, 2)
    fits[0][1].fail_at = 2

    def fit(i: int) -> Any:
        driver = fits[i][0]
        driver.begin(0)
        run_steps(driver, range(1, 4))

    results = on_threads(2, fit)
    assert isinstance(results[0], OSError) and isinstance(results[1], PeerFailedError)
    assert "disk full at step 2" in str(results[1])


def test_the_resume_record_process_0_picks_reaches_every_process(tmp_path: Path) -> None:
    fits = drivers(tmp_path, 3)
    record = CheckpointRecord(
        name="ckpt-step42.ckpt", step=42, epoch=1, created=1.0, size=10, checksum="0", algorithm="crc32", framework="fake"
    )
    fits[0][1].record = record
    results = on_threads(3, lambda i: fits[i][0].resume_record())
    assert [r.step if isinstance(r, CheckpointRecord) else r for r in results] == [42, 42, 42]


def test_a_failure_in_the_last_persist_is_raised_on_every_process(tmp_path: Path) -> None:
    fits = drivers(tmp_path, 2)
    fits[0][1].finish_error = OSError("the last persist failed")

    def fit(i: int) -> Any:
        driver = fits[i][0]
        driver.begin(0)
        run_steps(driver, range(1, 3))
        driver.finish()

    results = on_threads(2, fit)
    assert isinstance(results[0], OSError) and isinstance(results[1], PeerFailedError)


WAITED = "(deferred from step 3: a one-time preparation was still running)"


@pytest.mark.parametrize(
    "due, prefaulting, adapter_preparing, expected",
    [
        # nothing running: taken where due
        ({3: "profiling"}, set(), set(), [(3, "profiling")]),
        # the session's prefault runs at steps 3-4: taken at step 5, saying why
        ({3: "profiling"}, {3, 4}, set(), [(5, f"profiling {WAITED}")]),
        # the adapter's own preparation counts the same
        ({3: "profiling"}, set(), {3, 4, 5}, [(6, f"profiling {WAITED}")]),
        # both: taken when neither runs any more
        ({3: "profiling"}, {3}, {4}, [(5, f"profiling {WAITED}")]),
        # the policy's next decision does not replace the first one still waiting
        ({3: "profiling", 4: "interval"}, {3, 4}, set(), [(5, f"profiling {WAITED}")]),
        # a preparation with nothing due puts nothing off
        ({5: "interval"}, {2, 3, 4}, set(), [(5, "interval")]),
    ],
)
def test_a_due_checkpoint_waits_for_a_one_time_preparation_at_the_next_steps(
    tmp_path: Path, due: dict[int, str], prefaulting: set[int], adapter_preparing: set[int],
    expected: list[tuple[int, str]],
) -> None:  # fmt: skip
    config = Config(dirpath=str(tmp_path))
    session = FakeSession(config, due)
    session.prefaulting = prefaulting
    taker = Taker()
    driver = FitDriver(config, ProcessGroup(), session, taker, save_on_train_end=False,  # type: ignore[arg-type]
                       preparing=lambda: session.step in adapter_preparing)
    driver.begin(0)
    run_steps(driver, range(1, 8))
    assert taker.taken == expected


def test_a_preparation_that_lasts_delays_a_checkpoint_no_longer_than_the_limit(tmp_path: Path) -> None:
    config = Config(dirpath=str(tmp_path))
    session = FakeSession(config, {2: "profiling"})
    session.prefaulting = set(range(100))  # never finishes
    now = [0.0]
    taker = Taker()
    driver = FitDriver(config, ProcessGroup(), session, taker, save_on_train_end=False,  # type: ignore[arg-type]
                       clock=lambda: now[0])
    driver.begin(0)
    for step in range(1, 20):
        driver.step_end(step, loss=1.0)
        now[0] += PREPARATION_WAIT_S / 10  # every step takes a tenth of the limit
    # due at step 2 (t = 0.1 limit); at step 12 a whole limit has passed: taken there, waiting
    assert [s for s, _ in taker.taken] == [12]
    assert taker.taken[0][1].startswith("profiling (deferred from step 2")


def test_every_n_steps_checkpoints_are_taken_at_their_steps_during_a_preparation(tmp_path: Path) -> None:
    config = Config(dirpath=str(tmp_path), every_n_steps=3)
    session = FakeSession(config, {3: "every_n_steps=3", 6: "every_n_steps=3"})
    session.prefaulting = set(range(10))
    taker = Taker()
    driver = FitDriver(config, ProcessGroup(), session, taker, save_on_train_end=False)  # type: ignore[arg-type]
    driver.begin(0)
    run_steps(driver, range(1, 8))
    assert taker.taken == [(3, "every_n_steps=3"), (6, "every_n_steps=3")]  # the snapshot waits instead


def test_a_signal_and_the_final_checkpoint_do_not_wait_for_a_preparation(tmp_path: Path) -> None:
    driver, session, taker, handler = make(tmp_path, {2: "profiling"})
    session.prefaulting = set(range(10))
    driver.begin(0)
    run_steps(driver, range(1, 4))
    assert taker.taken == []
    driver.final(3)
    assert taker.taken == [(3, FINAL_REASON)]

    driver, session, taker, handler = make(tmp_path, {2: "profiling"}, on_preempt="continue")
    session.prefaulting = set(range(10))
    driver.begin(0)
    run_steps(driver, range(1, 3))
    handler.signum = TERM
    run_steps(driver, range(3, 4))
    assert taker.taken == [(3, "preempted by SIGTERM")]


class TickingClock:
    """A clock that advances 1 s at every reading; ``jump(s)`` adds ``s`` (work that took time)."""

    def __init__(self) -> None:
        self.now = 0.0

    tick = 1.0

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def jump(self, seconds: float) -> None:
        self.now += seconds


def test_the_hook_time_of_each_step_reaches_the_session_without_its_checkpoint(tmp_path: Path) -> None:
    clock = TickingClock()
    config = Config(dirpath=str(tmp_path))
    session = FakeSession(config, {2: "interval"})

    def take(due: Due) -> CheckpointEvent:
        clock.jump(100.0)  # the checkpoint's copy: its stall, not the hook's own time
        return CheckpointEvent(due.step, 0, due.reason, None, None, 0.0, 0)

    driver = FitDriver(config, ProcessGroup(), session, take, clock=clock)  # type: ignore[arg-type]
    driver.begin(0)
    for step in (1, 2, 3):
        driver.step_end(step, loss=1.0)
    # a decision reads the clock at its entry and before handing its time over: 1 tick; the
    # checkpoint's step reads it twice more around the checkpoint, whose 100 s are its stall;
    # handing it over took 1 tick, counted with the next decision
    assert session.hook_times == [1.0, 3.0, 2.0]


def test_a_hook_that_ends_while_the_device_still_runs_queued_steps_costs_nothing(tmp_path: Path) -> None:
    clock = TickingClock()
    config = Config(dirpath=str(tmp_path))
    session = FakeSession(config, {})
    queued = iter([True, False, True])  # the device's queue at the end of steps 1, 2, 3
    asked: list[int] = []

    def device_busy() -> bool:
        asked.append(len(session.hook_times))
        return next(queued)

    driver = FitDriver(config, ProcessGroup(), session, lambda due: None,  # type: ignore[arg-type]
                       device_busy=device_busy, clock=clock)
    driver.begin(0)
    for step in (1, 2, 3):
        driver.step_end(step, loss=1.0)
    assert asked == [0, 1, 2]  # once per step, before its hook time is handed over
    assert session.hook_times == [0.0, 2.0, 0.0]  # step 2 counts its own time and step 1's handing over


def test_a_device_probe_marks_its_queue_when_each_checkpoint_begins(tmp_path: Path) -> None:
    config = Config(dirpath=str(tmp_path))
    session = FakeSession(config, {2: "interval", 4: "interval"})
    log: list[str] = []

    class Probe:
        def __call__(self) -> bool:
            return False

        def mark(self) -> None:
            log.append("mark")

    def take(due: Due) -> None:
        log.append(f"take {due.step}")

    driver = FitDriver(config, ProcessGroup(), session, take, device_busy=Probe())  # type: ignore[arg-type]
    driver.begin(0)
    for step in range(1, 5):
        driver.step_end(step, loss=1.0)
    assert log == ["mark", "take 2", "mark", "take 4"]


def test_the_wait_for_a_slower_process_is_not_counted_as_hook_time(tmp_path: Path) -> None:
    fits = drivers(tmp_path, 2)

    def fit(i: int) -> None:
        driver = fits[i][0]
        driver.begin(0)
        for step in (1, 2, 3):
            if i == 1:
                time.sleep(0.2)  # process 1's steps are slower: process 0 waits in the collective
            driver.step_end(step, loss=1.0)

    on_threads(2, fit)
    hook_times = fits[0][1].hook_times
    assert len(hook_times) == 3 and all(h < 0.1 for h in hook_times), hook_times  # 0.2 s waits excluded
    assert fits[1][1].hook_times == []  # process 1 has no session: nothing recorded there


def test_between_decisions_a_step_is_only_noted_and_handed_over_with_the_next_decision(tmp_path: Path) -> None:
    clock = TickingClock()
    clock.tick = 0.01  # ten steps take less than FLUSH_S
    config = Config(dirpath=str(tmp_path))
    session = FakeSession(config, {10: "interval"})
    session.next_step = 10  # the policy: nothing is due before step 10
    taker = Taker()
    driver = FitDriver(config, ProcessGroup(), session, taker, clock=clock)  # type: ignore[arg-type]
    driver.begin(0)
    for step in range(1, 11):
        driver.step_end(step, loss=float(step))
    assert session.recorded == [[1], list(range(2, 11))]  # one decision at step 1, the next at 10
    assert taker.taken == [(10, "interval")]
    # steps 2-9 each read the clock at entry and exit (1 tick); step 10's decision 1 tick and 1
    # more for step 1's handing over: 8 + 2; step 10 took the checkpoint
    assert session.hook_times == pytest.approx([0.01, 0.08 + 0.02 + 0.01])
    assert session.losses == [None] * 10  # the uniform schedule reads no loss
    assert driver.last_loss == 10.0


def test_a_full_ring_or_a_signal_ends_the_hot_path(tmp_path: Path) -> None:
    from autockpt_core.step_ring import RING_STEPS

    driver, session, taker, handler = make(tmp_path, {}, on_preempt="continue")
    session.next_step = 10**6
    driver.begin(0)
    for step in range(1, 2 * RING_STEPS + 2):
        driver.step_end(step)
    assert [len(r) for r in session.recorded] == [1, RING_STEPS, RING_STEPS]
    handler.signum = TERM
    driver.step_end(2 * RING_STEPS + 2)  # the next step sees the signal: decided and checkpointed
    assert session.recorded[-1] == [2 * RING_STEPS + 2]
    assert taker.taken == [(2 * RING_STEPS + 2, "preempted by SIGTERM")]


def test_the_noted_steps_reach_the_session_before_a_boundary_and_the_final_checkpoint(tmp_path: Path) -> None:
    driver, session, taker, _ = make(tmp_path, {})
    session.next_step = 100
    driver.begin(0)
    for step in (1, 2, 3):
        driver.step_end(step, loss=float(step))
    driver.boundary(3)
    assert session.recorded == [[1], [2, 3]]
    driver.step_end(4, loss=4.0)
    driver.final(4)
    assert session.recorded == [[1], [2, 3], [4]]
    assert taker.taken == [(4, FINAL_REASON)]


def test_the_front_loaded_schedule_reads_every_steps_loss_when_handed_over(tmp_path: Path) -> None:
    config = Config(dirpath=str(tmp_path), schedule="front_loaded", mtbf=3600.0)
    session = FakeSession(config, {})
    session.next_step = 100
    read: list[object] = []

    def loss_of(value: object) -> float:
        read.append(value)
        return float(value) * 2  # type: ignore[arg-type]

    driver = FitDriver(config, ProcessGroup(), session, Taker(), loss_of=loss_of)  # type: ignore[arg-type]
    driver.begin(0)
    for step in (1, 2, 3):
        driver.step_end(step, loss=float(step))
    assert read == [1.0]  # step 1 decided; steps 2 and 3 are noted, not read yet
    driver.final(3)
    assert session.losses == [2.0, 4.0, 6.0]
