"""autockpt_core.preemption: signals set a flag only; handlers chain and are put back."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from autockpt_core import Config, ConfigError, Preempted, PreemptionHandler
from autockpt_core.preemption import exit_code, signal_names


@pytest.fixture
def restore_usr_handlers() -> Any:
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_signal_names_are_canonical_and_validated() -> None:
    assert signal_names(["TERM", "sigusr1", int(signal.SIGUSR2), "SIGTERM"]) == ("SIGTERM", "SIGUSR1", "SIGUSR2")
    with pytest.raises(ValueError, match="SIGFOO"):
        signal_names(["SIGFOO"])
    with pytest.raises(ValueError, match="cannot be caught"):
        signal_names(["KILL"])


def test_config_fields_validate_with_field_value_and_fix() -> None:
    assert Config(dirpath="c").signals == ("SIGTERM", "SIGUSR1", "SIGINT")
    assert Config(dirpath="c").on_preempt == "exit"
    assert Config(dirpath="c", signals="term, USR2").signals == ("SIGTERM", "SIGUSR2")
    assert Config(dirpath="c", signals=[]).signals == ()
    with pytest.raises(ConfigError) as info:
        Config(dirpath="c", signals=["SIGKILL"])
    assert info.value.field == "signals" and "Fix:" in str(info.value)
    with pytest.raises(ConfigError) as info:
        Config(dirpath="c", on_preempt="pause")
    assert info.value.field == "on_preempt" and "'exit'" in str(info.value)


def test_handler_sets_a_flag_chains_and_restores(restore_usr_handlers: Any) -> None:
    seen: list[int] = []
    previous = lambda signum, frame: seen.append(signum)  # noqa: E731
    signal.signal(signal.SIGUSR1, previous)
    handler = PreemptionHandler(["SIGUSR1", "SIGUSR2"])
    assert handler.install() and not handler.requested
    signal.raise_signal(signal.SIGUSR2)  # previous handler SIG_DFL: not called (it would terminate)
    signal.raise_signal(signal.SIGUSR1)
    assert handler.requested and handler.signum == signal.SIGUSR2 and handler.signal_name == "SIGUSR2"
    assert handler.count == 2 and seen == [signal.SIGUSR1]  # the Python handler before ours still ran
    handler.clear()
    assert not handler.requested
    handler.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_handler_installed_over_ours_is_left_in_place_and_ours_forwards(restore_usr_handlers: Any) -> None:
    seen: list[str] = []
    signal.signal(signal.SIGUSR1, lambda s, f: seen.append("before"))
    handler = PreemptionHandler(["SIGUSR1"])
    handler.install()
    ours = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, lambda s, f: (seen.append("later"), ours(s, f)))  # type: ignore[misc,operator]
    handler.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is not ours  # the later handler stays
    signal.raise_signal(signal.SIGUSR1)
    assert seen == ["later", "before"] and not handler.requested  # stale: forwards, records nothing


def test_install_off_the_main_thread_does_nothing(restore_usr_handlers: Any, caplog: pytest.LogCaptureFixture) -> None:
    handler = PreemptionHandler(["SIGUSR1"])
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(handler.install()))
    thread.start()
    thread.join()
    assert result == [False] and not handler.installed
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    assert "main thread" in caplog.text


def test_preempted_exits_with_128_plus_signal() -> None:
    exc = Preempted(signal.SIGTERM, step=12)
    assert isinstance(exc, SystemExit) and exc.code == exit_code(signal.SIGTERM) == 143
    assert exc.signal_name == "SIGTERM" and exc.step == 12


def test_the_same_signal_a_third_time_falls_back_to_the_previous_disposition(restore_usr_handlers: Any) -> None:
    seen: list[int] = []
    previous = lambda signum, frame: seen.append(signum)  # noqa: E731
    signal.signal(signal.SIGUSR1, previous)
    signal.signal(signal.SIGUSR2, previous)  # (SIG_DFL would end this test process)
    handler = PreemptionHandler(["SIGUSR1", "SIGUSR2"])
    handler.install()
    signal.raise_signal(signal.SIGUSR2)
    signal.raise_signal(signal.SIGUSR1)  # another signal while SIGUSR2 is pending: counted only
    assert handler.installed and handler.signum == signal.SIGUSR2 and handler.count == 2
    signal.raise_signal(signal.SIGUSR2)  # the same one again at once: the same request twice
    assert handler.installed and handler.requested and handler.absorbed == 1 and handler.count == 3
    signal.raise_signal(signal.SIGUSR2)  # a third: ours are gone, the previous one acts
    assert not handler.installed and handler.count == 4
    assert seen == [signal.SIGUSR2, signal.SIGUSR1, signal.SIGUSR2]
    assert signal.getsignal(signal.SIGUSR1) is previous and signal.getsignal(signal.SIGUSR2) is previous


def test_a_repeat_after_the_absorbing_window_falls_back_at_once(restore_usr_handlers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from autockpt_core import preemption

    seen: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    handler = PreemptionHandler(["SIGUSR1"])
    handler.install()
    signal.raise_signal(signal.SIGUSR1)
    monkeypatch.setattr(preemption, "REPEAT_ABSORBED_S", -1.0)  # every repeat comes "later"
    signal.raise_signal(signal.SIGUSR1)
    assert not handler.installed and handler.absorbed == 0 and seen == [signal.SIGUSR1, signal.SIGUSR1]


def test_clear_forgets_an_absorbed_repeat(restore_usr_handlers: Any) -> None:
    signal.signal(signal.SIGUSR1, lambda s, f: None)
    handler = PreemptionHandler(["SIGUSR1"])
    handler.install()
    signal.raise_signal(signal.SIGUSR1)
    signal.raise_signal(signal.SIGUSR1)
    handler.clear()  # on_preempt="continue": acted on
    signal.raise_signal(signal.SIGUSR1)
    signal.raise_signal(signal.SIGUSR1)  # a new request, delivered twice: absorbed again
    assert handler.installed and handler.requested and handler.absorbed == 1
    handler.uninstall()


def test_the_same_signal_after_clear_is_a_new_request(restore_usr_handlers: Any) -> None:
    signal.signal(signal.SIGUSR1, lambda s, f: None)
    handler = PreemptionHandler(["SIGUSR1"])
    handler.install()
    signal.raise_signal(signal.SIGUSR1)
    handler.clear()  # on_preempt="continue": acted on
    signal.raise_signal(signal.SIGUSR1)
    assert handler.installed and handler.requested
    handler.uninstall()


def test_a_handler_whose_training_ended_hands_the_signal_on(restore_usr_handlers: Any) -> None:
    seen: list[str] = []
    signal.signal(signal.SIGUSR1, lambda s, f: seen.append("previous"))
    running = [True]
    handler = PreemptionHandler(["SIGUSR1"], alive=lambda frame: running[0])
    handler.install()
    signal.raise_signal(signal.SIGUSR1)
    assert handler.requested and seen == ["previous"]
    handler.clear()
    running[0] = False  # fit() raised without uninstalling
    signal.raise_signal(signal.SIGUSR1)
    assert not handler.requested and not handler.installed and seen == ["previous", "previous"]


def test_first_sigint_is_deferred_and_the_second_raises_keyboard_interrupt() -> None:
    saved = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        handler = PreemptionHandler(["SIGINT"])
        handler.install()
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt mid-step
        assert handler.requested
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, saved)


def test_a_handler_left_by_a_failed_fit_is_not_chained(restore_usr_handlers: Any) -> None:
    seen: list[str] = []
    user = lambda s, f: seen.append("user")  # noqa: E731
    signal.signal(signal.SIGUSR1, user)
    left = PreemptionHandler(["SIGUSR1"], alive=lambda frame: False)
    left.install()  # never uninstalled: its fit() raised
    handler = PreemptionHandler(["SIGUSR1"])
    handler.install()
    assert handler.previous(signal.SIGUSR1) is user
    signal.raise_signal(signal.SIGUSR1)
    assert handler.requested and seen == ["user"]
    handler.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is user


@pytest.mark.parametrize(
    "on_preempt, signum, ends",
    [("exit", signal.SIGTERM, True), ("continue", signal.SIGTERM, False), ("continue", signal.SIGUSR1, False),
     ("exit", signal.SIGINT, True), ("continue", signal.SIGINT, True)],
)
def test_a_run_stops_after_the_emergency_checkpoint_on_exit_and_always_on_ctrl_c(on_preempt, signum, ends) -> None:
    from autockpt_core.preemption import stops

    assert stops(on_preempt, signum) is ends
