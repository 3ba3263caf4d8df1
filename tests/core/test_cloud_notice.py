"""``preemption_notice``: each provider's endpoint, mimicked by a real HTTP server on 127.0.0.1
(nothing else is ever reached), read by the watch's own thread until the notice comes."""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from autockpt_core import Config, ConfigError
from autockpt_core.cloud_notice import NoticeWatch, parse_notice, probe
from autockpt_core.preemption import PreemptionHandler
from autockpt_core.preemption_sources import preemption_for
from tests.metadata_server import Metadata, serving


@pytest.fixture
def metadata() -> Iterator[Metadata]:
    with serving() as server:
        yield server


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("aws", ("aws", "http://169.254.169.254")),
        ("gce", ("gce", "http://metadata.google.internal")),
        ("azure:http://127.0.0.1:9/", ("azure", "http://127.0.0.1:9")),
        ("https://example.invalid/notice", ("url", "https://example.invalid/notice")),
    ],
)
def test_the_forms_of_a_notice(value: str | None, expected: tuple[str, str] | None) -> None:
    assert parse_notice(value) == expected


@pytest.mark.parametrize("value", ["ec2", "aws:ftp://x", "", 5, "/var/run/notice"])
def test_an_unknown_notice_is_an_error_naming_the_field_and_the_forms(value: object) -> None:
    with pytest.raises(ConfigError, match=r"preemption_notice=.*Fix: pass 'aws', 'gce', 'azure'"):
        Config(dirpath="/tmp/x", preemption_notice=value)


@pytest.mark.parametrize("provider, path", [("aws", None), ("gce", None), ("azure", None), ("url", "/notice")])
def test_each_provider_says_nothing_until_its_notice(provider: str, path: str | None, metadata: Metadata) -> None:
    base = metadata.base + (path or "")
    assert probe(provider, base) is None
    metadata.notice = True
    notice = probe(provider, base)
    assert notice is not None and notice != ""
    if provider == "aws":  # IMDSv2: the token first, then the GET with it
        assert [(m, p) for m, p, _ in metadata.seen[:2]] == [("PUT", "/latest/api/token"),
                                                             ("GET", "/latest/meta-data/spot/instance-action")]  # fmt: skip
        assert "terminate" in notice
    if provider == "azure":
        assert "Preempt" in notice and "21:00:00" in notice


def test_a_notice_reaches_the_handler_from_the_watchs_thread_within_a_poll(metadata: Metadata) -> None:
    watch = NoticeWatch("gce", metadata.base, poll_s=0.05)
    handler = PreemptionHandler((), sources=[watch])
    handler.install()
    time.sleep(0.3)
    assert not handler.requested and len(metadata.seen) >= 3  # polled, no notice
    metadata.notice = True
    noticed = time.monotonic()
    while not handler.requested and time.monotonic() - noticed < 5:
        time.sleep(0.01)
    assert handler.requested and handler.signum == signal.SIGTERM and handler.source == "preemption notice"
    assert time.monotonic() - noticed < 1.0
    polls = len(metadata.seen)
    time.sleep(0.2)
    assert len(metadata.seen) == polls  # the watch ends with its notice
    handler.uninstall()


def test_an_unreachable_endpoint_is_logged_once_and_once_more_when_it_answers(
    metadata: Metadata, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    watch = NoticeWatch("url", f"http://127.0.0.1:{port}/notice", poll_s=0.01)
    asked: list[Any] = []
    with caplog.at_level(logging.WARNING, logger="autockpt"):
        for _ in range(5):
            assert not watch.check(lambda *a: asked.append(a))
        watch.base = metadata.base + "/notice"
        assert not watch.check(lambda *a: asked.append(a))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "cannot read the url preemption notice" in messages[0]
    assert "answers again" in messages[1] and asked == []


def test_the_fits_handler_has_a_notice_watch_where_asked() -> None:
    handler = preemption_for(Config(dirpath="/tmp/x", deadline=None, preemption_notice="aws", notice_poll_interval="2s"))
    assert handler is not None and [type(s) for s in handler.sources] == [NoticeWatch]
    assert handler.sources[0].poll_s == 2.0 and handler.sources[0].base == "http://169.254.169.254"
