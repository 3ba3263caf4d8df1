"""A Keras job on JAX over two processes (``jax.distributed``, gloo on 127.0.0.1), really started.

``tests/fault/keras_script.py --strategy jaxdist`` runs two processes under a ``DataParallel``
over both, each feeding its own half of the data: process 0 writes the checkpoints, every
process agrees with it at each step (``autockpt_keras.processes``) and resumes from the same
file with its own generators. Faults take the whole job (both processes at once, as a
launcher tears a job down) and a signal reaches process 1 only (a write failing on process 0
is in tests/contract); then the rerun's final weights must equal the uninterrupted two-process run's, bit for bit.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autockpt_core import read_manifest, storage_for
from tests.fault import harness
from tests.keras.test_keras_faults import COMMAND, Baseline

pytestmark = [pytest.mark.integration]

jax = pytest.importorskip("jax")

ARGS = ["--backend", "jax", "--strategy", "jaxdist", "--inputs", "arrays", "--val", "--epochs", "3", "--every", "2"]
WORKER = Path(__file__).with_name("jax_distributed_worker.py")


def test_two_processes_killed_as_a_job_and_preempted_on_one_end_bitwise_equal(tmp_path: Path) -> None:
    """6 steps per epoch (48 samples per process, batch 8 each). Process 1's dropout masks and
    data half count in the final weights, so its generators must be restored as exactly as
    process 0's."""
    baseline = Baseline(tmp_path, ARGS)
    plans = [
        {"phase": "snapshot", "nth": 2},  # process 0, inside the copy of step 4's checkpoint
        {"phase": "persist", "nth": 2},  # process 0's second file half written (first: step 4 again)
        {"phase": "step", "at": 8, "action": "sigterm", "rank": 1},  # only process 1 is signalled
        {"phase": "step", "at": 13, "rank": 1},  # process 1 kills the job in the middle of a step
    ]
    result = harness.run_until_done(
        COMMAND,
        tmp_path / "ck",
        tmp_path / "w.npz",
        plans=plans,
        kill_after=[random.Random(0).uniform(6.0, 11.0)],  # the job, from outside, at an unplanned point
        extra_args=ARGS,
    )
    result.assert_faults_happened()
    report = result.report()
    codes = [a.returncode for a in result.attempts]
    assert codes[:4] == [-9, -9, 143, -9], report
    assert all(a.returncode == 0 or a.killed_externally for a in result.attempts[4:]), report
    assert [a.newest_step for a in result.attempts[:3]] == [2, 4, 9], report
    assert result.attempts[3].newest_step in (11, 12), report  # step 12's commit may come after the kill
    assert all(e["rank"] == 1 for a in result.attempts[2:4] for e in a.events), report
    assert "SIGTERM received; checkpoint of step 9 committed" in result.attempts[2].output, report
    assert "resumed from" in result.attempts[3].output and "(step 9)" in result.attempts[3].output, report
    harness.assert_weights_equal(result.weights, baseline.result())
    newest = read_manifest(storage_for(tmp_path / "ck"))[-1]
    assert newest.step == 18 and (tmp_path / "ck" / newest.name).is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("distribution", ["none", "local"])
def test_two_processes_without_a_data_parallel_distribution_over_both_are_refused(
    tmp_path: Path, distribution: str
) -> None:
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), str(port), distribution, str(tmp_path / "ckpts"), str(tmp_path / f"{i}.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outputs = [proc.communicate(timeout=240)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for i, (proc, output) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, output[-3000:]
        result = json.loads((tmp_path / f"{i}.json").read_text())
        assert result["processes"] == 2
        error = result["error"]
        expected = "not no keras.distribution" if distribution == "none" else "but it spans 1"
        assert error is not None and expected in error and "Fix: keras.distribution.set_distribution" in error, error
        assert result["dirpath_exists"] is False  # refused before anything was written
