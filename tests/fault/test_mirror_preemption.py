"""Preemption with an S3 mirror whose network goes first (item: emergency checkpoints with a mirror).

A real job (``mirror_preempt_script.py``, its own process) mirrors to a real S3-compatible
server (``moto.server``, its own process on 127.0.0.1). Once the first checkpoint is in the
bucket, the server is SIGKILLed (connections refused) or SIGSTOPped (connections hang, as a
network that stops answering), then the job gets SIGTERM. The emergency checkpoint is committed
in ``dirpath`` and the job exits 143 within ``mirror_preempt_wait`` (3 s) and a little more,
saying that the mirror does not have it. Before, the exit status was 1 (refused) or the job
waited with no deadline (hung).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autockpt_core import read_manifest
from autockpt_core.persist import LocalStorage

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("outage", "grace"), [("killed", None), ("stopped", None), ("stopped", "6s")])
def test_a_preemption_with_the_mirror_down_commits_locally_and_exits_143_in_bounded_time(
    tmp_path: Path, outage: str, grace: str | None
) -> None:
    """``grace``: no ``mirror_preempt_wait``; the mirror gets what is left of ``grace_period``."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from tests.s3_server import S3Server

    server = S3Server().start()
    dirpath = tmp_path / "fast"
    job = subprocess.Popen(
        [sys.executable, "-m", "tests.fault.mirror_preempt_script", str(dirpath), server.url("run"), server.endpoint,
         *([grace] if grace else [])],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    mirrored = threading.Event()

    def drain() -> None:  # read everything the job prints, so it never blocks on a full pipe
        assert job.stdout is not None
        for line in job.stdout:
            lines.append(line)
            if line.strip() == "mirrored":
                mirrored.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert mirrored.wait(120), "".join(lines)
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGKILL if outage == "killed" else signal.SIGSTOP)
        time.sleep(0.5)  # the next checkpoints are committed locally, their uploads fail or hang
        start = time.monotonic()
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
        took = time.monotonic() - start
        reader.join(10)
    finally:
        if job.poll() is None:
            job.kill()
        if server.process is not None and server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.stop()
    output = "".join(lines)
    said = [line for line in output.splitlines() if "SIGTERM received" in line]
    assert job.returncode == 143, output[-3000:]
    assert len(said) == 1 and "committed (" in said[0] and "not in the mirror" in said[0], output[-3000:]
    assert "exiting with status 143" in said[0]
    newest = read_manifest(LocalStorage(dirpath))[-1]
    assert f"checkpoint of step {newest.step} committed" in said[0]  # the local tier holds it
    assert took < 20, f"{took:.1f}s to exit after SIGTERM"  # mirror_preempt_wait=3s, not an unbounded wait
    if grace is not None:  # within the grace period: what the scheduler allows before SIGKILL
        assert took < 6.0, f"{took:.1f}s to exit after SIGTERM, grace_period {grace}"
        assert "s after the signal (grace_period 6 s)" in said[0] and "did not finish within" in said[0], said[0]
