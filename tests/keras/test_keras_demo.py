"""The Keras demo worker (``autockpt demo`` runs it): a short run prints what was measured
and decided. In a subprocess, as ``autockpt demo`` starts it (the backend is fixed at import)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("keras")

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.integration
def test_demo_prints_measured_decisions(tmp_path: Path) -> None:
    env = dict(os.environ, KERAS_BACKEND="torch", OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [sys.executable, "-m", "autockpt_keras.demo", "--dirpath", str(tmp_path / "demo"), "--budget", "2%",
           "--epochs", "1", "--width", "32", "--samples", "1024", "--batch-size", "32"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"checkpoint at step \d+ \(epoch 1\): .*; stall [\d.]+ ms for ", proc.stdout), proc.stdout
    assert "measured:" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("autockpt: ")
