"""``deadline``: its forms, when the watch asks, and how the request reaches the preemption handler."""

from __future__ import annotations

import datetime
import signal
import threading
import time

import pytest

from autockpt_core import Config, ConfigError
from autockpt_core.deadline import MARGIN_S, UNMEASURED_LEAD_S, DeadlineWatch, process_start, resolve
from autockpt_core.preemption import PreemptionHandler
from autockpt_core.preemption_sources import emergency_lead, preemption_for
from autockpt_core.run_status import StatusFile


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("off", None),
        ("20s", 1020.0),
        (90, 1090.0),
        ("1h30m", 1000.0 + 5400),
        ("2026-11-28T23:00:00+00:00", datetime.datetime(2026, 11, 28, 23, tzinfo=datetime.timezone.utc).timestamp()),
        ("slurm", 1795900000.0),
    ],
)
def test_the_forms_of_a_deadline(value: object, expected: float | None) -> None:
    assert resolve(value, started=1000.0, environ={"SLURM_JOB_END_TIME": "1795900000"}) == expected


def test_slurm_outside_slurm_is_no_deadline() -> None:
    assert resolve("slurm", environ={}) is None


@pytest.mark.parametrize("value", ["soon", "-5s", 0, "2026-13-45T25:00:00", [1]])
def test_a_deadline_of_no_known_form_is_an_error_naming_the_field_and_the_forms(value: object) -> None:
    with pytest.raises(ConfigError, match=r"deadline=.*ISO wall time.*Fix: pass e\.g\. deadline='3h50m'"):
        Config(dirpath="/tmp/x", deadline=value)


def test_the_default_is_slurms_end_time_and_it_is_read_at_the_fits_start_only() -> None:
    assert Config(dirpath="/tmp/x").deadline == "slurm"


def test_a_duration_counts_from_this_process_start() -> None:
    assert time.time() - 3600 < process_start() <= time.time()
    assert abs(resolve("60s") - (process_start() + 60)) < 0.01


@pytest.mark.parametrize(
    "lead, asks_at",
    [(None, 100.0 - UNMEASURED_LEAD_S), (1.0, 100.0 - (1.5 * 1.0 + MARGIN_S)), (4.0, 100.0 - (6.0 + MARGIN_S))],
)
def test_the_watch_asks_once_lead_seconds_before_the_end(lead: float | None, asks_at: float) -> None:
    now = [0.0]
    asked: list[tuple[int, str]] = []
    watch = DeadlineWatch(100.0, lambda: lead, wall=lambda: now[0])
    assert watch.start_s() == pytest.approx(asks_at)
    now[0] = asks_at - 0.01
    assert not watch.check(lambda *a: asked.append(a)) and asked == []
    now[0] = asks_at
    assert watch.check(lambda *a: asked.append(a))
    now[0] = asks_at + 1
    assert watch.check(lambda *a: asked.append(a))
    assert asked == [(signal.SIGTERM, "deadline")] and watch.requested_at == asks_at


def test_the_request_reaches_the_handler_as_a_signal_would_from_the_watchs_thread() -> None:
    watch = DeadlineWatch(time.time() + UNMEASURED_LEAD_S + 0.2, poll_s=0.05)
    handler = PreemptionHandler((), sources=[watch])
    assert handler.install() is False  # no signal handler; the watch runs
    deadline = time.monotonic() + 5
    while not handler.requested and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handler.requested and handler.signum == signal.SIGTERM and handler.source == "deadline"
    assert handler.received_at is not None
    handler.uninstall()
    assert watch._thread is None


def test_a_request_while_one_is_acted_on_changes_nothing_and_clear_forgets_it() -> None:
    handler = PreemptionHandler(())
    handler.request(signal.SIGUSR1, "notice")
    handler.request(signal.SIGTERM, "deadline")
    assert (handler.signum, handler.source) == (signal.SIGUSR1, "notice")
    handler.clear()
    assert not handler.requested and handler.source is None


class Source:
    name = "probe"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, request: object) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")


def test_the_sources_start_once_with_the_handler_and_stop_with_it() -> None:
    source = Source()
    handler = PreemptionHandler(("SIGUSR2",), sources=[source])
    on_main = threading.current_thread() is threading.main_thread()
    assert handler.install() is on_main
    handler.install()
    handler.uninstall()
    handler.uninstall()
    assert source.calls == ["start", "stop"]


def test_the_fits_handler_gathers_the_signals_and_the_deadline() -> None:
    assert preemption_for(Config(dirpath="/tmp/x", signals=(), deadline=None)) is None
    plain = preemption_for(Config(dirpath="/tmp/x", deadline=None))
    assert plain is not None and plain.sources == () and plain.signals == ("SIGTERM", "SIGUSR1", "SIGINT")
    timed = preemption_for(Config(dirpath="/tmp/x", signals=(), deadline="1h"))
    assert timed is not None and [type(s) for s in timed.sources] == [DeadlineWatch]


def test_the_lead_is_the_emergency_cost_the_status_figures_measure(tmp_path: object) -> None:
    class Estimates:
        iter_time_s, stall_s, persist_s = 0.2, 0.05, 0.5

    class Session:
        status = StatusFile(None)

    handler = preemption_for(Config(dirpath="/tmp/x", deadline="1h"))
    emergency_lead(handler, Session())
    watch = handler.sources[0]
    assert watch.lead() is None  # nothing measured yet
    Session.status.report("training", 10, estimates=Estimates())  # no file: the figures alone
    assert watch.lead() == pytest.approx(0.75)
    emergency_lead(handler, object())  # a process without a session keeps what it had
    assert watch.lead() == pytest.approx(0.75)
