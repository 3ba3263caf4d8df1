"""Kill Keras training processes at chosen and random moments; the rerun ends bitwise equal.

Each test runs ``tests/fault/keras_script.py`` (contract: ``tests/fault/harness.py``) in
fresh processes: once without the callback (the baseline, run alongside the faulty
sequence), then with faults, one per process — SIGKILL inside the snapshot, halfway through
writing a checkpoint file, after the file is renamed but before the manifest lists it, while
retention deletes an old file, at a training step (also while a resumed epoch is still
skipping), SIGTERM (emergency checkpoint, exit status 143), an injected ENOSPC, a corrupted
newest checkpoint — and finally reruns until training is done. The final model and
optimizer variables must equal the baseline's bit for bit.

CI runs one sequence per backend (TensorFlow, torch, JAX), and one on TensorFlow under a
``MirroredStrategy`` over two logical CPU devices, on shuffled arrays with dropout and
validation; ``@pytest.mark.slow`` runs every input type, more kills, random external kills
and other seeds. No assertion depends on time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

from tests.fault import harness

pytestmark = pytest.mark.integration

COMMAND = [sys.executable, "-m", "tests.fault.keras_script"]
BACKENDS = ["tensorflow", "torch", "jax"]


class Baseline:
    """The uninterrupted run without the callback, in a thread beside the faulty runs."""

    def __init__(self, workdir: Path, extra: Sequence[str]) -> None:
        self.weights: dict[str, np.ndarray] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(workdir, list(extra)), daemon=True)
        self._thread.start()

    def _run(self, workdir: Path, extra: list[str]) -> None:
        try:
            self.weights = harness.run_baseline(COMMAND, workdir, extra_args=extra)
        except BaseException as exc:  # re-raised in the test thread by result()
            self.error = exc

    def result(self) -> dict[str, np.ndarray]:
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.weights is not None
        return self.weights


def faulty_sequence(
    workdir: Path,
    extra: Sequence[str],
    plans: Sequence[dict[str, Any] | str],
    kill_after: Sequence[float] = (),
) -> tuple[harness.FaultRun, list[str]]:
    """One process per plan (``"corrupt"``: damage the newest checkpoint instead), then random
    external kills, then reruns until done. Returns the run and every process's output."""
    dirpath, out = workdir / "ckpts", workdir / "weights.npz"
    attempts: list[harness.Attempt] = []
    for plan in plans:
        if plan == "corrupt":
            harness.corrupt_newest(dirpath, "truncate")
            continue
        assert isinstance(plan, dict)
        attempt = harness.run_once(COMMAND, dirpath, out, plan, extra_args=extra)
        assert attempt.returncode != 0, "finished before its fault:\n" + attempt.describe() + attempt.output[-3000:]
        attempts.append(attempt)
    run = harness.run_until_done(COMMAND, dirpath, out, kill_after=kill_after, extra_args=extra)
    run.attempts[:0] = attempts
    return run, [a.output for a in run.attempts]


def check(run: harness.FaultRun, baseline: dict[str, np.ndarray], outputs: list[str], context: str = "") -> None:
    run.assert_faults_happened()
    errors = [o for o in outputs if "Traceback" in o and "injected" not in o]
    assert not errors, context + "\n" + errors[0][-4000:]
    try:
        harness.assert_weights_equal(run.weights, baseline)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{context}") from None


def check_last_epoch_logs(workdir: Path, context: str = "") -> None:
    """The epoch logs (loss and metrics, restored mid-epoch) of the last epoch equal the
    baseline's, when the final process trained that epoch."""
    final = json.loads((workdir / "weights.npz.logs.json").read_text())
    base = json.loads((workdir / "baseline.npz.logs.json").read_text())
    last = base["epochs"][-1]
    if not final["epochs"] or final["epochs"][-1] != last:
        return  # the final process had nothing left to train
    for key, values in base["history"].items():
        if key.startswith("autockpt_"):
            continue
        assert final["history"][key][-1] == values[-1], f"{key}: {final['history'][key][-1]} != {values[-1]}\n{context}"


def ci_plans(rng: random.Random) -> list[dict[str, Any] | str]:
    """Three SIGKILLs at randomly chosen moments, a SIGTERM and a corrupted checkpoint."""
    return [
        {"phase": "persist", "nth": rng.randint(1, 3)},  # halfway through writing a checkpoint file
        {"phase": "step", "at": 14, "action": "sigterm"},  # emergency checkpoint of step 15, exit 143
        "corrupt",  # that checkpoint is damaged: the next run falls back to step 12's
        {"phase": "snapshot", "nth": rng.randint(1, 3)},  # inside the copy
        {"phase": "step", "at": rng.randint(13, 34)},  # before a step's update (or while skipping)
    ]


def fault_seed() -> int:
    """Seed of the kill moments: AUTOCKPT_FAULT_SEED to replay a failure, else a fresh one."""
    text = os.environ.get("AUTOCKPT_FAULT_SEED")
    return int(text) if text else random.SystemRandom().randrange(1 << 30)


class Sequence_:
    """The CI fault sequence of one backend, run in a thread (its baseline in another)."""

    def __init__(self, backend: str, workdir: Path, flags: Sequence[str] = ()) -> None:
        self.backend, self.workdir = backend, workdir
        self.seed = fault_seed()
        self.extra = ["--backend", backend, "--inputs", "arrays", "--val", *flags]
        self.run: harness.FaultRun | None = None
        self.outputs: list[str] = []
        self.error: BaseException | None = None
        self.baseline = Baseline(workdir, self.extra)
        self._thread = threading.Thread(target=self._go, daemon=True)
        self._thread.start()

    def _go(self) -> None:
        try:
            self.run, self.outputs = faulty_sequence(self.workdir, self.extra, ci_plans(random.Random(self.seed)))
        except BaseException as exc:  # re-raised in the test thread
            self.error = exc

    def result(self) -> tuple[harness.FaultRun, list[str], dict[str, np.ndarray]]:
        self._thread.join()
        if self.error is not None:
            raise AssertionError(f"AUTOCKPT_FAULT_SEED={self.seed}: {self.error}") from self.error
        assert self.run is not None
        return self.run, self.outputs, self.baseline.result()


#: The CI sequences: one per backend, and TensorFlow under a MirroredStrategy over two logical CPUs.
CI_CASES = {**{backend: (backend, []) for backend in BACKENDS}, "tensorflow-mirrored": ("tensorflow", ["--strategy", "mirrored"])}


@pytest.fixture(scope="module")
def ci_sequences(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Sequence_]:
    """Every case's sequence starts at once: on 2 cores they overlap each other's waits."""
    return {case: Sequence_(backend, tmp_path_factory.mktemp(f"faults-{case}"), flags)
            for case, (backend, flags) in CI_CASES.items() if importlib.util.find_spec(backend) is not None}


@pytest.mark.parametrize("case", CI_CASES)
def test_killed_run_resumes_bitwise_equal(case: str, ci_sequences: dict[str, Sequence_]) -> None:
    if case not in ci_sequences:
        pytest.skip(f"{CI_CASES[case][0]} is not installed")
    sequence = ci_sequences[case]
    run, outputs, baseline = sequence.result()
    context = f"AUTOCKPT_FAULT_SEED={sequence.seed}\n{run.report()}"
    sigterm = run.attempts[1]
    assert sigterm.returncode == 143, context  # 128 + SIGTERM, after the commit
    assert sigterm.newest_step == 15 and "SIGTERM received; checkpoint of step 15 committed" in sigterm.output
    after_corrupt = run.attempts[2].output  # falls back to the previous checkpoint (step 12)
    assert "skipping checkpoint ckpt-step000000015" in after_corrupt, context + after_corrupt[-3000:]
    assert "resumed from" in after_corrupt and "ckpt-step000000012" in after_corrupt, context
    check(run, baseline, outputs, context)
    check_last_epoch_logs(sequence.workdir, context)


# -- slow: every input type, more kills, random moments, other seeds ----------------------------------

SLOW_PLANS: list[dict[str, Any] | str] = [
    {"phase": "snapshot", "nth": 2},
    {"phase": "persist", "nth": 2},
    {"phase": "commit", "nth": 2},  # file renamed, manifest not yet written
    {"phase": "retention", "nth": 1},  # manifest written, old file not yet deleted
    {"phase": "step", "at": 14, "action": "sigterm"},
    {"phase": "persist", "nth": 1, "action": "enospc"},  # CheckpointWriteError, nothing deleted
    {"phase": "step", "at": 17},
    {"phase": "step", "at": 1},  # the resumed epoch is still skipping: killed before any training
    "corrupt",
    {"phase": "step", "at": 25},
]

SLOW_CASES = [
    ("tensorflow", "arrays", ["--val"]),
    ("tensorflow", "pydataset", ["--val"]),
    ("tensorflow", "tfdata", ["--val"]),
    ("tensorflow", "tfdata", ["--every", "5", "--async-persist", "0"]),  # checkpoints at an epoch's first batch
    ("tensorflow", "repeat", []),
    ("tensorflow", "arrays", ["--steps-per-epoch", "5", "--epochs", "7", "--val"]),
    ("tensorflow", "arrays", ["--async-persist", "0", "--seed", "3"]),
    ("tensorflow", "pydataset", ["--steps-per-execution", "3", "--every", "6"]),
    ("tensorflow", "dataloader", ["--val"]),  # iterated in tf.data's thread
    ("torch", "arrays", ["--val"]),
    ("torch", "pydataset", ["--val"]),
    ("torch", "dataloader", ["--val"]),
    ("torch", "tfdata", []),
    ("torch", "repeat", ["--async-persist", "0"]),
    ("torch", "arrays", ["--steps-per-epoch", "5", "--epochs", "7", "--val", "--seed", "3"]),
    ("tensorflow", "tfdata", ["--strategy", "mirrored", "--val"]),
    # (steps_per_execution > 1 under MirroredStrategy fails in Keras 3.15 itself, without autockpt)
    ("tensorflow", "pydataset", ["--strategy", "mirrored", "--steps-per-epoch", "5", "--epochs", "7"]),
    ("jax", "arrays", ["--val"]),
    ("jax", "arrays", ["--strategy", "dataparallel", "--val"]),  # keras.distribution over 2 CPU devices
    ("jax", "pydataset", ["--val"]),
    ("jax", "dataloader", []),
    ("jax", "tfdata", []),
    ("jax", "repeat", ["--async-persist", "0"]),
    ("jax", "arrays", ["--steps-per-epoch", "5", "--epochs", "7", "--val", "--seed", "3"]),
    ("jax", "pydataset", ["--steps-per-execution", "3", "--every", "6"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "inputs", "flags"), SLOW_CASES, ids=lambda v: v if isinstance(v, str) else "-".join(v))
def test_many_faults_every_input_type(backend: str, inputs: str, flags: list[str], tmp_path: Path) -> None:
    extra = ["--backend", backend, "--inputs", inputs, *flags]
    baseline = Baseline(tmp_path, extra)
    rng = random.Random(f"{backend}-{inputs}-{flags}")
    kill_after = [rng.uniform(4.0, 9.0) for _ in range(3)]  # external SIGKILLs at random moments
    run, outputs = faulty_sequence(tmp_path, extra, SLOW_PLANS, kill_after=kill_after)
    enospc = next(a for a in run.attempts if a.plan and a.plan.get("action") == "enospc")
    assert "CheckpointWriteError" in enospc.output and "No space left on device" in enospc.output
    check(run, baseline.result(), outputs, run.report())
    check_last_epoch_logs(tmp_path, run.report())
