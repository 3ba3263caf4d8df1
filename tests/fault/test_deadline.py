"""``deadline``: a run longer than its deadline ends before it with a committed checkpoint and a
non-zero status, and the rerun resumes there, ending bitwise equal to an uninterrupted run.

Real processes in both frameworks (Keras on TensorFlow): each training step sleeps 0.2 s, so
the run (120 steps) would take about 24 s; its deadline is 20 s after its process started.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from tests.fault.harness import assert_weights_equal, load_weights, run_baseline, run_once

pytestmark = pytest.mark.integration

RUNS = {
    "lightning": ([sys.executable, "-m", "tests.fault.lightning_script"], ["--epochs", "10", "--every", "4"],
                  r"resuming from step {step}\b"),
    "keras": ([sys.executable, "-m", "tests.fault.keras_script"],
              ["--backend", "tensorflow", "--epochs", "10", "--every", "4"], r"resumed from \S+ \(step {step}\)"),
}  # fmt: skip
DEADLINE_S = 20.0


@pytest.mark.parametrize("framework", sorted(RUNS))
def test_a_deadline_ends_a_longer_run_before_it_and_the_rerun_resumes_there(framework: str, tmp_path: Path) -> None:
    command, args, resumed = RUNS[framework]
    expected = run_baseline(command, tmp_path, args)
    dirpath = tmp_path / "ckpts"
    started = time.monotonic()
    first = run_once(command, dirpath, tmp_path / "first.npz",
                     extra_args=[*args, "--deadline", f"{DEADLINE_S:g}s", "--step-sleep", "0.2"])  # fmt: skip
    took = time.monotonic() - started
    assert first.returncode == 143, first.output[-3000:]
    assert took < DEADLINE_S, (took, first.output[-3000:])
    said = re.search(r"the deadline came \(SIGTERM\); checkpoint of step (\d+) committed", first.output)
    assert said is not None, first.output[-3000:]
    step = int(said.group(1))
    assert first.newest_step == step and 0 < step < 120
    assert "the deadline (" in first.output and "taking the emergency checkpoint" in first.output
    second = run_once(command, dirpath, tmp_path / "second.npz", extra_args=args)
    assert second.returncode == 0, second.output[-3000:]
    assert re.search(resumed.format(step=step), second.output), second.output[-3000:]
    assert_weights_equal(load_weights(tmp_path / "second.npz"), expected)
