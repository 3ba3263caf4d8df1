"""The harness on the framework-free toy script: every fault phase, in real processes.

The toy script drives ``CheckpointSession`` with the core RNG and preemption modules, so
these tests cover the core's crash consistency end to end (about 0.2 s per process).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from tests.fault.harness import (
    assert_weights_equal,
    corrupt_newest,
    load_weights,
    run_baseline,
    run_once,
    run_until_done,
)

COMMAND = [sys.executable, "-m", "tests.fault.toy_script"]

EVERY_PHASE = [
    {"phase": "snapshot", "nth": 2},
    {"phase": "persist", "nth": 2},
    {"phase": "commit", "nth": 2},
    {"phase": "retention", "nth": 1},
    {"phase": "step", "at": 30, "action": "sigterm"},
    {"phase": "persist", "nth": 1, "action": "enospc"},
    {"phase": "persist", "nth": 1, "action": "eacces"},
    {"phase": "step", "at": 50},
]


def test_kills_in_every_phase_signals_and_storage_errors_end_bitwise_equal(tmp_path: Path) -> None:
    expected = run_baseline(COMMAND, tmp_path)
    result = run_until_done(COMMAND, tmp_path / "ck", tmp_path / "w.npz", plans=EVERY_PHASE)
    result.assert_faults_happened()
    codes = [a.returncode for a in result.attempts]
    assert codes == [-9, -9, -9, -9, 143, 1, 1, -9, 0], result.report()
    sigterm = result.attempts[4]
    assert sigterm.newest_step == 31  # the emergency checkpoint of the step the signal arrived in
    assert "No space left on device" in result.attempts[5].output and "may not write there" in result.attempts[6].output
    steps = [a.newest_step for a in result.attempts]
    assert steps == sorted(steps)  # faults never lose committed progress
    assert_weights_equal(result.weights, expected)


@pytest.mark.parametrize("mode", ["truncate", "bitflip"])
def test_corrupt_newest_file_falls_back_and_ends_bitwise_equal(tmp_path: Path, mode: str) -> None:
    expected = run_baseline(COMMAND, tmp_path)
    ckpts, out = tmp_path / "ck", tmp_path / "w.npz"
    first = run_once(COMMAND, ckpts, out, {"phase": "step", "at": 40})
    assert first.returncode == -9
    damaged = corrupt_newest(ckpts, mode)  # the newest committed one (36 or 39: the kill races the persist)
    result = run_until_done(COMMAND, ckpts, out)
    assert f"skipping checkpoint {damaged.name}" in result.attempts[0].output
    assert_weights_equal(result.weights, expected)


def test_sigterm_with_on_preempt_continue_finishes_in_one_run(tmp_path: Path) -> None:
    expected = run_baseline(COMMAND, tmp_path)
    ckpts, out = tmp_path / "ck", tmp_path / "w.npz"
    attempt = run_once(
        COMMAND, ckpts, out, {"phase": "step", "at": 10, "action": "sigterm"}, extra_args=["--on-preempt", "continue"]
    )
    assert attempt.returncode == 0 and attempt.events
    assert_weights_equal(load_weights(out), expected)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_random_faults_and_random_time_kills(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    expected = run_baseline(COMMAND, tmp_path, extra_args=["--steps", "120"])
    phases = ["snapshot", "persist", "commit", "retention", "step"]
    plans = []
    for _ in range(8):
        phase = rng.choice(phases)
        plan = (
            {"phase": phase, "at": rng.randrange(1, 119)}
            if phase == "step"
            else {"phase": phase, "nth": rng.randint(1, 5)}
        )
        if rng.random() < 0.2:
            plan["action"] = "sigterm" if phase == "step" else rng.choice(["enospc", "eacces"])
        plans.append(plan)
    result = run_until_done(
        COMMAND,
        tmp_path / "ck",
        tmp_path / "w.npz",
        plans=plans,
        kill_after=[rng.uniform(0.05, 0.4) for _ in range(4)],
        extra_args=["--steps", "120", "--every", str(rng.randint(1, 4))],
        max_clean_reruns=2,
        require_all=False,
    )
    assert_weights_equal(result.weights, expected)
