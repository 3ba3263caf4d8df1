"""The Keras study worker (``autockpt_bench.workers.keras_study``): the three models match
``param_count``; ``train`` + ``restore`` of autockpt (exact) and of ``ModelCheckpoint`` (replays
the epoch); a ``goodput`` run SIGKILLed mid-way and rerun to the end. Workers run as
subprocesses, as the commands start them (the backend is fixed at import)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autockpt_bench.study.protocol import read_events, read_spec, write_spec
from autockpt_bench.study.workloads import QUICK, param_count

pytest.importorskip("keras")
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
WORKER = "autockpt_bench.workers.keras_study"
SMALL = QUICK["small"]  # 60 steps per epoch


def _spec(tmp_path: Path, case: str, method: dict[str, Any], **fields: Any) -> Path:
    spec = tmp_path / f"{case}.spec.json"
    base = {"dir": str(tmp_path / "ckpt"), "steps": 25, "warmup": 5, "threads": 1, "keras_backend": "tensorflow",
            "out": str(tmp_path / f"{case}.json"), "reference": str(tmp_path / "reference.npz"),
            "log": str(tmp_path / "events.jsonl"), "started_at": time.time()}
    write_spec(spec, SMALL, method, **{**base, **fields})
    return spec


def _command(case: str, spec: Path) -> list[str]:
    return [sys.executable, "-m", WORKER, case, "--spec", str(spec)]


def _run(tmp_path: Path, case: str, method: dict[str, Any], **fields: Any) -> dict[str, Any]:
    import json

    spec = _spec(tmp_path, case, method, **fields)
    proc = subprocess.run(_command(case, spec), check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp_path / f"{case}.json").read_text())


TRAIN_KEYS = {"framework", "workload", "method", "params", "state_bytes", "steps", "warmup", "step_s", "step_s_median",
              "checkpoint_steps", "blocked_s", "save_s", "checkpoint_bytes", "format", "peak_rss_bytes", "threads",
              "hook_s_median"}
#: autockpt's runs also give the overhead it reported (beside the slowdown measured against a baseline)
REPORTED = {"reported_overhead", "reported_band", "final_interval_steps"}
RESTORE_KEYS = {"framework", "workload", "method", "restore_s", "imports_s", "load_s", "skip_s", "resumed_step",
                "final_step", "max_abs_diff", "exact"}


def test_models_match_param_count() -> None:
    from autockpt_bench.workers.keras_models import build_model, trainable_params

    for workload in QUICK.values():
        model = build_model(workload, compile=False)
        assert trainable_params(model) == param_count(workload), workload.name


def test_the_array_input_runs_without_tf_data_autotuning() -> None:
    """Every method's input: an autotuned iterator's destruction can stall an epoch start for
    seconds (``input_without_autotuning``), so the worker turns autotuning off for all of them."""
    code = (
        "from autockpt_bench.workers.keras_study import setup_backend\n"
        "setup_backend({'keras_backend': 'tensorflow', 'threads': 1})\n"
        "import numpy as np\n"
        "from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter\n"
        "ds = ArrayDataAdapter(np.ones((8, 2)), np.ones(8), batch_size=4, shuffle=False).get_tf_dataset()\n"
        "print(ds.options().autotune.enabled, sum(1 for _ in ds))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split()[-2:] == ["False", "2"]  # autotuning off; the same two batches


def test_autockpt_train_then_restore_is_exact(tmp_path: Path) -> None:
    method = {"name": "autockpt", "every": 10}
    train = _run(tmp_path, "train", method)
    assert set(train) == TRAIN_KEYS | REPORTED
    assert train["checkpoint_steps"] == [10, 20]
    assert train["params"] == SMALL.params and train["format"] == ".safetensors"
    assert len(train["blocked_s"]) == len(train["save_s"]) == 2
    assert all(s is not None and s > 0 for s in train["save_s"])
    assert train["checkpoint_bytes"] > 4 * SMALL.params and train["step_s"] > 0
    restore = _run(tmp_path, "restore", method)
    assert set(restore) == RESTORE_KEYS
    assert restore["resumed_step"] == 20 and restore["final_step"] == 25
    assert restore["exact"] is True and restore["max_abs_diff"] == 0.0
    assert 0 < restore["load_s"] < restore["restore_s"]
    assert 0 < restore["imports_s"] < restore["restore_s"]
    assert SMALL.steps_per_epoch > 20  # step 20 is mid-epoch: its 20 batches were drawn, not trained
    assert 0 < restore["skip_s"] < restore["restore_s"]


def test_modelcheckpoint_h5_train_then_restore_replays_the_epoch(tmp_path: Path) -> None:
    method = {"name": "modelcheckpoint-h5", "every": 10}
    train = _run(tmp_path, "train", method)
    assert set(train) == TRAIN_KEYS
    assert train["checkpoint_steps"] == [10, 20] and train["format"] == ".weights.h5"
    assert all(isinstance(s, float) for s in train["save_s"] + train["blocked_s"])
    assert isinstance(train["checkpoint_bytes"], int) and train["checkpoint_bytes"] > 0
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["ckpt-e0001-b00010.weights.h5", "ckpt-e0001-b00020.weights.h5"]
    restore = _run(tmp_path, "restore", method)
    assert set(restore) == RESTORE_KEYS
    # Adam's state and step are restored (optimizer built before load_weights); epoch 1 is replayed
    # from its first batch to the job's data position 25: 20 + 25 steps.
    assert restore["resumed_step"] == 20 and restore["final_step"] == 45
    assert isinstance(restore["exact"], bool) and isinstance(restore["max_abs_diff"], float)
    assert isinstance(restore["load_s"], float) and isinstance(restore["restore_s"], float)


def test_goodput_resumes_after_sigkill(tmp_path: Path) -> None:
    steps = 3 * SMALL.steps_per_epoch
    spec = _spec(tmp_path, "goodput", {"name": "autockpt", "every": 10}, steps=steps, warmup=0)
    log = read_spec(spec)[2]["log"]
    proc = subprocess.Popen(_command("goodput", spec), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 240
        while proc.poll() is None and time.time() < deadline:
            if any(e["event"] == "step" and e["step"] >= 25 for e in read_events(log)):
                break
            time.sleep(0.002)
        assert proc.poll() is None, "the first run ended before it could be killed: " + proc.stderr.read().decode()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    first = read_events(log)
    assert not any(e["event"] == "done" for e in first)
    rerun = subprocess.run(_command("goodput", spec), check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    events = read_events(log)
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    assert len(starts) == 2
    second = events[starts[1]:]
    resumed = [e for e in second if e["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["step"] > 0 and resumed[0]["step"] % 10 == 0
    newest = max(e["step"] for e in first if e["event"] == "checkpoint")  # taken; maybe killed while persisting
    assert newest - 10 <= resumed[0]["step"] <= newest
    trained = [e["step"] for e in second if e["event"] == "step"]
    assert trained == list(range(resumed[0]["step"] + 1, steps + 1))
    done = second[-1]
    assert done["event"] == "done" and done["step"] == steps
    assert done["persist_s"] is None or done["persist_s"] > 0
    assert all(e["blocked_s"] >= 0 for e in events if e["event"] == "checkpoint")


def test_in_process_ab_takes_checkpoints_in_the_on_blocks_only(tmp_path: Path) -> None:
    # warm-up 5 (on: step 4), then blocks of 12: 6-17 on, 18-29 off, 30-41 on, 42-53 off
    train = _run(tmp_path, "train", {"name": "autockpt-ab", "every": 4, "block": 12, "budget": 0.02}, steps=53)
    assert train["checkpoint_steps"] == [4, 8, 12, 16, 32, 36, 40]
    assert train["ab_block"] == 12 and train["ab_spill_steps"] >= 6  # the guard: half a block
    # steps of a few ms: a persist (the first starts the persist process) can outlast an off block, which
    # leaves that cycle no reference; the figures themselves are checked in test_in_process_ab
    assert len(train["ab_cycles"]) <= 2 and (train["ab_overhead"] is None) == (not train["ab_cycles"])
