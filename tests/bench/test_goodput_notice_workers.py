"""``autockpt goodput --notice``: the real study workers (Lightning, Keras on TensorFlow) run
autockpt with its signals on, so the notice's SIGTERM commits the step and exits 143, and the
rerun resumes there (without a notice, the study runs autockpt with ``signals=()``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autockpt_bench.study import protocol
from autockpt_bench.study.workloads import QUICK

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SMALL = QUICK["small"]
STEPS = 2 * SMALL.steps_per_epoch


def _spec(tmp_path: Path, framework: str) -> Path:
    path = tmp_path / "goodput.json"
    protocol.write_spec(
        path, SMALL, {"name": "autockpt", "every": 1000}, dir=str(tmp_path / "ckpt"), steps=STEPS, warmup=0,
        threads=1, keras_backend="tensorflow", out=str(tmp_path / "unused.json"), log=str(tmp_path / "events.jsonl"),
        notice_s=3.0,
    )
    return path


@pytest.mark.parametrize("framework", ["lightning", "keras"])
def test_the_notice_commits_the_step_and_the_rerun_resumes_there(tmp_path: Path, framework: str) -> None:
    pytest.importorskip("lightning" if framework == "lightning" else "keras")
    spec = _spec(tmp_path, framework)
    log = tmp_path / "events.jsonl"
    command = [sys.executable, "-m", protocol.WORKERS[framework], "goodput", "--spec", str(spec)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not any(e["event"] == "step" and e["step"] >= 30 for e in protocol.read_events(log)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert returncode == 128 + signal.SIGTERM
    first = protocol.read_events(log)
    checkpoints = [e["step"] for e in first if e["event"] == "checkpoint"]
    assert checkpoints and checkpoints[-1] >= 30  # the emergency checkpoint, not a scheduled one (every 1000)
    rerun = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    events = protocol.read_events(log)
    resumed = [e["step"] for e in events if e["event"] == "resumed"]
    assert resumed == [0, checkpoints[-1]]
    assert events[-1]["event"] == "done" and events[-1]["step"] == STEPS
