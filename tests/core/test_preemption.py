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
    assert Config(dirpath="c").signals == ("SIGTERM", "SIGUSR1")
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
