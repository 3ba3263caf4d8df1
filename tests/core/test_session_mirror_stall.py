"""A mirror whose endpoint goes silent: a real S3-compatible server behind a TCP proxy that stops
forwarding (``tests/fault_proxy.py``), as a hung route or a dead load balancer does.

An upload that makes no progress for ``mirror_stall_timeout`` is a failed upload: a warning
comes within that time, training goes on, and ``finish()`` returns once the endpoint is back
or the failure rules stop the uploads; it never blocks forever.
"""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

from autockpt_core import CheckpointSession, Config, read_manifest
from autockpt_core.errors import MirrorWriteError
from autockpt_core.persist import storage_for
from tests.core.test_session_mirror import snapshot_of
from tests.fault_proxy import FaultProxy

STALL_S = 1.0


@pytest.fixture
def proxy(s3_server: Any) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_server.port).start()
    yield proxy
    proxy.stop()


def session_for(dirpath: Path, url: str, proxy: FaultProxy, **config: Any) -> CheckpointSession:
    options = {"endpoint_url": proxy.endpoint, "key": "testing", "secret": "testing"}
    cfg = Config(dirpath=str(dirpath), mirror=url, storage_options=options, every_n_steps=1000, warmup_steps=0,
                 verbose=False, mirror_stall_timeout=STALL_S, **config)  # fmt: skip
    return CheckpointSession(cfg, framework="np", suffix=".safetensors")


def checkpoint(session: CheckpointSession, step: int) -> None:
    session.step_end(step)
    session.save(step, 0, snapshot_of(float(step)))


def test_a_silent_endpoint_warns_within_the_stall_timeout_and_the_mirror_catches_up(
    tmp_path: Path, s3_server: Any, proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    url = s3_server.url(f"stall-{uuid.uuid4().hex[:8]}")
    session = session_for(tmp_path / "node", url, proxy)
    session.start(0)
    checkpoint(session, 1)
    session.flush()  # in both tiers
    caplog.set_level(logging.WARNING, logger="autockpt")
    proxy.stall()
    stalled_at = time.monotonic()
    checkpoint(session, 2)
    warned_at = None
    step = 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        while time.monotonic() - stalled_at < 20:  # training goes on meanwhile
            step += 1
            session.step_end(step)
            if "made no progress" in caplog.text:
                warned_at = time.monotonic()
                break
            time.sleep(0.01)
    assert warned_at is not None, "no warning within 20 s of a silent endpoint"
    print(f"\nstall to warning: {warned_at - stalled_at:.2f} s (mirror_stall_timeout {STALL_S:g} s)")
    assert warned_at - stalled_at < STALL_S + 3
    assert [r.step for r in session.records()] == [1, 2]  # dirpath has every checkpoint
    proxy.resume()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        session.finish()
    assert read_manifest(storage_for(url, s3_server.storage_options))[-1].step == 2  # caught up


def test_an_endpoint_that_stays_silent_stops_by_the_failure_rules_and_finish_returns(
    tmp_path: Path, s3_server: Any, proxy: FaultProxy
) -> None:
    url = s3_server.url(f"stall-{uuid.uuid4().hex[:8]}")
    session = session_for(tmp_path / "node", url, proxy, mirror_max_failures=2)
    session.start(0)
    proxy.stall()
    checkpoint(session, 1)
    start = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(MirrorWriteError, match="no progress") as info:
            session.finish()
    assert time.monotonic() - start < 15
    assert "committed in" in str(info.value)
    assert [r.step for r in session.records()] == [1]
