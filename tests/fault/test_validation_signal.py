"""A signal during validation is acted on at the next validation batch, not after validation.

Real processes in both frameworks (Keras on TensorFlow). Each validation batch sleeps 0.8 s
and the validation has 32 batches: about 25 s. SIGTERM comes at its third batch (about 2 s
in), with ``grace_period="8s"``. The run must exit 143 within those 8 s, with the last trained
step committed. The rerun runs the interrupted validation again, then trains on, and ends
bitwise equal to an uninterrupted run. Lightning validates every 6 steps here (a validation
mid-epoch), Keras after each epoch.

One case cannot be exact: Lightning's validation after an epoch's last batch of a train loader
without a length. Its checkpoint is committed anyway, and the rerun resumes from it with a
``ResumeNotExactWarning``.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from autockpt_core.persist import read_manifest, storage_for
from autockpt_core.run_status import read_status
from tests.fault.harness import assert_weights_equal, load_weights, run_baseline, run_once

pytestmark = pytest.mark.integration

GRACE_S = 8.0
VALIDATION = ["--val", "--val-batch", "1"]  # 32 validation batches
RUNS = {
    "lightning": ([sys.executable, "-m", "tests.fault.lightning_script"],
                  [*VALIDATION, "--epochs", "2", "--every", "4", "--val-every", "6"], 6, r"resuming from step 6\b"),
    "keras": ([sys.executable, "-m", "tests.fault.keras_script"],
              [*VALIDATION, "--backend", "tensorflow", "--epochs", "2", "--every", "5"], 12, r"resumed from \S+ \(step 12\)"),
}  # fmt: skip
SIGTERM_IN_VALIDATION = {"phase": "val", "nth": 3, "action": "sigterm"}


@pytest.mark.parametrize("framework", sorted(RUNS))
def test_sigterm_2s_into_a_25s_validation_commits_within_the_grace_period(framework: str, tmp_path: Path) -> None:
    command, args, step, resumed = RUNS[framework]
    expected = run_baseline(command, tmp_path, args)
    dirpath = tmp_path / "ckpts"
    first = run_once(command, dirpath, tmp_path / "first.npz", SIGTERM_IN_VALIDATION,
                     extra_args=[*args, "--val-sleep", "0.8", "--grace", f"{GRACE_S:g}s"])  # fmt: skip
    ended = time.time()
    assert first.returncode == 143, first.output[-3000:]
    assert len(first.events) == 1 and first.events[0]["step"] == step, first.describe()
    took = ended - first.events[0]["time"]
    assert took < GRACE_S, (took, first.output[-3000:])
    said = re.search(r"SIGTERM received; checkpoint of step (\d+) committed .* ([\d.]+) s after the signal", first.output)
    assert said is not None and int(said.group(1)) == step, first.output[-3000:]
    assert first.newest_step == step
    newest = read_manifest(storage_for(dirpath))[-1]
    assert newest.meta["reason"] == "preempted by SIGTERM" and "not_exact" not in newest.meta
    status = read_status(dirpath) or {}
    assert status["state"] == "preempted" and 0 < status["signal_to_durable_s"] < took, status
    second = run_once(command, dirpath, tmp_path / "second.npz", extra_args=args)
    assert second.returncode == 0, second.output[-3000:]
    assert re.search(resumed, second.output), second.output[-3000:]
    assert "ResumeNotExactWarning" not in second.output
    assert_weights_equal(load_weights(tmp_path / "second.npz"), expected)


def test_the_inexact_case_is_committed_marked_and_warned_at_the_resume(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "tests.fault.lightning_script"]
    args = ["--val", "--val-batch", "4", "--epochs", "2", "--every", "5", "--loader", "iterable"]
    dirpath = tmp_path / "ckpts"
    first = run_once(command, dirpath, tmp_path / "first.npz", {"phase": "val", "nth": 1, "action": "sigterm"},
                     extra_args=args)  # fmt: skip
    assert first.returncode == 143 and first.newest_step == 12, first.output[-3000:]
    newest = read_manifest(storage_for(dirpath))[-1]
    assert "after an epoch's last batch of a train loader without a length" in newest.meta["not_exact"]
    second = run_once(command, dirpath, tmp_path / "second.npz", extra_args=args)
    assert second.returncode == 0, second.output[-3000:]
    assert re.search(r"ResumeNotExactWarning: autockpt: resuming from step 12, a checkpoint taken during", second.output)
