"""autockpt_keras/strategies.py: tf.distribute strategies and JAX processes, really started.

MirroredStrategy over two logical CPU devices trains, is killed and resumes bitwise exactly in
``test_keras_faults.py`` (``--strategy mirrored``); here: the refusal of jobs that span
processes, by two real workers of a MultiWorkerMirroredStrategy on 127.0.0.1. JAX jobs over two
processes: ``test_keras_jax_distributed.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("strategy_worker.py")


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def test_two_worker_multi_worker_mirrored_strategy_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    ports = [str(p) for p in _free_ports(2)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")
    _run_two([[str(WORKER), str(i), *ports, str(tmp_path / "ckpts"), str(tmp_path / f"{i}.json")] for i in range(2)], env)
    for i in range(2):
        result = json.loads((tmp_path / f"{i}.json").read_text())
        assert result["strategy"] == "CollectiveAllReduceStrategy"  # what MultiWorkerMirroredStrategy() makes
        error = result["error"]
        assert error is not None and "not MultiWorkerMirroredStrategy with 2 workers" in error, error
        assert "Fix: train in one process" in error
        assert result["dirpath_exists"] is False  # nothing was created: no lock, no manifest


def _run_two(argv: list[list[str]], env: dict[str, str]) -> list[str]:
    """Start both processes, wait for both (a hang fails by timeout), return their output."""
    procs = [subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for args in argv]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            proc.kill()
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output[-3000:]
    return outputs


def test_one_process_strategies_pass_the_check() -> None:
    tf = pytest.importorskip("tensorflow")
    from autockpt_keras.strategies import check_strategy, workers

    class Model:
        def __init__(self, strategy: object) -> None:
            self._distribute_strategy = strategy

    for strategy in (tf.distribute.OneDeviceStrategy("/cpu:0"), tf.distribute.MirroredStrategy(["/cpu:0"]), None):
        check_strategy(Model(strategy))  # no error
        if strategy is not None:
            assert workers(strategy) == 1
