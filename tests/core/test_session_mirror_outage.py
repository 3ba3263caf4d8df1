"""An outage of the mirror's endpoint with the default settings: a real S3-compatible server
behind a TCP proxy that refuses every connection for a while (``tests/fault_proxy.py``).

With the defaults, only ``mirror_max_outage`` (30 min) without a successful upload stops
training: through an outage of 20 s (five failures in a row, which stopped training after 15 s
under the earlier default of ``mirror_max_failures=5``) training goes on, each failure is a
warning with the count and the age of the mirror's newest upload, and the mirror catches up
once the endpoint is back. botocore's own retries are turned off here (``config_kwargs``), so
every refused upload reaches autockpt's rules at once; with them on, an attempt takes longer
to fail and the same outage gives fewer warnings.
"""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

from autockpt_core import CheckpointSession, Config, read_manifest
from autockpt_core.persist import storage_for
from tests.core.test_session_mirror import snapshot_of
from tests.fault_proxy import FaultProxy

@pytest.mark.parametrize(
    "outage_s", [20.0, pytest.param(120.0, marks=pytest.mark.slow, id="2min")], ids=lambda s: f"{s:g}s"
)
def test_an_outage_with_the_defaults_warns_trains_on_and_the_mirror_catches_up(
    tmp_path: Path, s3_server: Any, caplog: Any, outage_s: float
) -> None:
    proxy = FaultProxy(s3_server.port).start()
    url = s3_server.url(f"outage-{uuid.uuid4().hex[:8]}")
    # botocore's own retries off, so each refused upload is a failure of autockpt's rules at once
    options = {"endpoint_url": proxy.endpoint, "key": "testing", "secret": "testing",
               "config_kwargs": {"retries": {"max_attempts": 1}}}  # fmt: skip
    config = Config(dirpath=str(tmp_path / "node"), mirror=url, storage_options=options, every_n_steps=1000,
                    warmup_steps=0, verbose=False)  # fmt: skip
    assert config.mirror_max_failures is None and config.mirror_max_outage == 1800.0
    session = CheckpointSession(config, framework="np", suffix=".safetensors")
    caplog.set_level(logging.WARNING, logger="autockpt")
    try:
        session.start(0)
        session.step_end(1)
        session.save(1, 0, snapshot_of(1.0))
        session.flush()  # step 1 in both tiers
        proxy.refuse = True  # the endpoint is down: new connections are closed at once
        proxy.cut()
        down_at = time.monotonic()
        step = 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            while time.monotonic() - down_at < outage_s:  # training goes on, a checkpoint a second
                step += 1
                session.step_end(step)
                session.save(step, 0, snapshot_of(float(step)))
                time.sleep(1.0)
            proxy.refuse = False
            back_at = time.monotonic()
            session.finish()  # the retry after the outage uploads the newest checkpoint
            print(f"\noutage {outage_s:g}s: {session.mirror.failed_uploads} failed uploads, "  # type: ignore[union-attr]
                  f"caught up {time.monotonic() - back_at:.1f}s after the endpoint came back")
    finally:
        proxy.stop()
    assert session.mirror is not None and session.mirror.failed_uploads >= 3
    assert "the mirror's newest is step 1, uploaded" in caplog.text
    assert "stops after 30.0min without a successful upload (mirror_max_outage)" in caplog.text
    assert read_manifest(storage_for(url, s3_server.storage_options))[-1].step == step
