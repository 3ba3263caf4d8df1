"""A mirror whose uploads take several checkpoint intervals: a real S3-compatible server behind a
slow network (``tests/fault_proxy.py``), a job SIGKILLed mid-upload, and the reruns that follow.

Retention in the fast tier must keep what the mirror still has to upload, and a rerun on the
same node must never resume older work than the node's own newest checkpoint of the run.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from autockpt_core import CheckpointSession, Config, read_manifest
from autockpt_core.persist import LocalStorage, storage_for
from tests.core.test_session_mirror import snapshot_of, value_of
from tests.fault_proxy import FaultProxy

KEEP_LAST = 3
STEPS = 16
STATE_BYTES = 64 * 1024 * 4  # the child's checkpoint: 64 Ki float32
INTERVAL_S = 0.1

SLOW_UPLOADS = f"""
import sys, time
import numpy as np
from autockpt_core import CheckpointSession, Config, Snapshot, write_tensor_file

fast, url, endpoint = sys.argv[1:4]
options = {{"endpoint_url": endpoint, "key": "testing", "secret": "testing"}}
session = CheckpointSession(
    Config(dirpath=fast, mirror=url, storage_options=options, every_n_steps=1000, warmup_steps=0,
           verbose=False, keep_last={KEEP_LAST}),
    framework="np", suffix=".safetensors",
)

def snapshot_of(value):
    def snapshot(pool):
        buf = pool.get("w", ({STATE_BYTES // 4},), np.float32)
        buf[:] = value
        return Snapshot(write=lambda f: write_tensor_file(f, {{"w": buf}}), nbytes=buf.nbytes)
    return snapshot

session.start(0)
for step in range(1, {STEPS} + 1):
    session.step_end(step)
    session.save(step, 0, snapshot_of(float(step)))
    session.writer.wait()  # committed in the fast tier; its upload runs in the background
    time.sleep({INTERVAL_S})
print("ready", flush=True)
time.sleep(600)  # SIGKILLed here, with uploads lagging
"""


@pytest.fixture
def slow_network(s3_server: Any) -> Iterator[FaultProxy]:
    # an upload of one checkpoint takes about five checkpoint intervals
    proxy = FaultProxy(s3_server.port, rate=STATE_BYTES / (5 * INTERVAL_S)).start()
    yield proxy
    proxy.stop()


def session_for(dirpath: Path, url: str, endpoint: str) -> CheckpointSession:
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    config = Config(dirpath=str(dirpath), mirror=url, storage_options=options, every_n_steps=1000, warmup_steps=0,
                    verbose=False, keep_last=KEEP_LAST)  # fmt: skip
    return CheckpointSession(config, framework="np", suffix=".safetensors")


def test_uploads_five_intervals_long_then_sigkill_each_rerun_resumes_the_newest_work(
    tmp_path: Path, s3_server: Any, slow_network: FaultProxy
) -> None:
    root = Path(__file__).resolve().parents[2]
    node, url = tmp_path / "node", s3_server.url(f"lag-{uuid.uuid4().hex[:8]}")
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_UPLOADS, str(node), url, slow_network.endpoint],
        cwd=root, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    slow_network.rate = None
    remote = storage_for(url, s3_server.storage_options)
    mirrored = [r.step for r in read_manifest(remote)]
    local = [r.step for r in read_manifest(LocalStorage(node))]
    assert mirrored and mirrored[-1] < STEPS - 2, f"the uploads did not lag: mirror {mirrored}"
    assert local[-KEEP_LAST:] == list(range(STEPS - KEEP_LAST + 1, STEPS + 1))
    # pinned beyond keep_last: at most the upload in flight and the newest waiting
    assert len(local) <= KEEP_LAST + 2, local

    fresh = session_for(tmp_path / "fresh-node", url, slow_network.endpoint)
    record = fresh.resume_record()
    fresh.close()
    assert record is not None and fresh.copied_from_mirror and record.step == mirrored[-1]
    assert value_of(fresh.storage, record.name) == float(mirrored[-1])

    rerun = session_for(node, url, slow_network.endpoint)
    record = rerun.resume_record()
    assert record is not None and record.step == STEPS and not rerun.copied_from_mirror
    assert value_of(rerun.storage, record.name) == float(STEPS)
    rerun.start(STEPS)
    rerun.step_end(STEPS + 1)
    rerun.save(STEPS + 1, 0, snapshot_of(float(STEPS + 1)))
    rerun.finish()
    steps = [r.step for r in read_manifest(LocalStorage(node))]
    assert steps == list(range(STEPS - KEEP_LAST + 2, STEPS + 2)), steps  # the resumed step kept, in order
    assert read_manifest(remote)[-1].step == STEPS + 1
