"""Default settings on ordinary models, under the limits users have (issue: the default path).

Real Lightning and Keras jobs, each a fresh process under ``ulimit -Sn 1024`` (the soft limit
most Linux machines and containers give a process), with a model of more than 1,000 tensors
(parameters and optimizer state) and, for Lightning, hyper-parameters in a dataclass and an
enum defined in the training script. Each runs until autockpt's persist process has written
checkpoints, and is rerun with the same command. Before the fix the Lightning job stopped
with ``OSError: [Errno 24] Too many open files`` at its first checkpoint (one descriptor per
tensor), and with fewer tensors with ``CheckpointWriteError`` once the persist process was up
(it could not unpickle ``__main__.HParams``).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autockpt_core.persist.shared_memory import shared_memory_supported

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not shared_memory_supported(), reason="the persist process needs Linux"),
]

ROOT = Path(__file__).resolve().parents[2]
SOFT_LIMIT = 1024


def _limit_open_files() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(SOFT_LIMIT, hard), hard))


def run_script(script: str, args: list[str], out: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fault" / script), *args, str(out)],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, preexec_fn=_limit_open_files,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.exists(), f"{script} wrote no result (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(out.read_text())
    assert "error" not in result, f"{script} failed:\n{result['error']}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    return result


def test_lightning_default_settings_1000_tensors_and_a_script_dataclass_under_1024_files(tmp_path: Path) -> None:
    dirpath = tmp_path / "ckpts"
    first = run_script("default_path_lightning.py", [str(dirpath), "2"], tmp_path / "first.json")
    assert first["soft_limit"] == SOFT_LIMIT and first["tensors"] > 1000
    assert first["persist_mode"] == "process" and first["process_writes"] >= 2
    assert first["autockpt_warnings"] == []  # the persist process never failed a write
    assert first["peak_fds"] < 200  # descriptors do not grow with the number of tensors
    assert first["events"][-1] == first["final_step"] == first["records"][-1]  # the final checkpoint is committed
    assert first["saved_hp_ok"]  # the dataclass and the enum round-trip through the file
    rerun = run_script("default_path_lightning.py", [str(dirpath), "1"], tmp_path / "rerun.json")
    # resumed from the final checkpoint; from the one before it when the final one is at an
    # epoch's end, where Lightning does not continue exactly (docs/reliability.md, G6c)
    at_epoch_end = first["final_step"] % first["batches_per_epoch"] == 0
    assert rerun["start_step"] == (first["records"][-2] if at_epoch_end else first["final_step"])
    assert rerun["process_writes"] >= 1 and rerun["autockpt_warnings"] == [] and rerun["saved_hp_ok"]
    assert rerun["final_step"] > first["final_step"] and rerun["records"][-1] == rerun["final_step"]


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_keras_default_settings_1000_tensors_under_1024_files(tmp_path: Path, backend: str) -> None:
    pytest.importorskip(backend)
    dirpath = tmp_path / "ckpts"
    env = {"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "1"}  # fmt: skip
    first = run_script("default_path_keras.py", [str(dirpath), "2"], tmp_path / "first.json", env)
    assert first["soft_limit"] == SOFT_LIMIT and first["tensors"] > 1000
    assert first["persist_mode"] == "process" and first["process_writes"] >= 2
    assert first["autockpt_warnings"] == [] and first["peak_fds"] < 200
    assert first["events"][-1] == first["final_step"] == first["records"][-1]
    rerun = run_script("default_path_keras.py", [str(dirpath), "1"], tmp_path / "rerun.json", env)
    assert rerun["start_step"] == first["final_step"]
    assert rerun["process_writes"] >= 1 and rerun["autockpt_warnings"] == []
    assert rerun["records"][-1] == rerun["final_step"] > first["final_step"]
