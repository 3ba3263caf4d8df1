"""The Lightning study worker (``autockpt compare`` / ``autockpt goodput`` run it): the models match
``param_count``, and real worker processes train, restore and survive a SIGKILL as the protocol says."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
pytest.importorskip("torchdata")

from autockpt_bench.study import protocol  # noqa: E402
from autockpt_bench.study.workloads import QUICK, Workload, param_count  # noqa: E402

pytestmark = pytest.mark.integration

TRAIN_KEYS = {
    "framework", "workload", "method", "params", "state_bytes", "steps", "warmup", "step_s", "step_s_median",
    "checkpoint_steps", "blocked_s", "save_s", "checkpoint_bytes", "format", "peak_rss_bytes", "threads",
    "hook_s_median",
}
#: autockpt's runs also give the overhead it reported (beside the slowdown measured against a baseline)
REPORTED = {"reported_overhead", "reported_band", "final_interval_steps"}
RESTORE_KEYS = {
    "framework", "workload", "method", "restore_s", "imports_s", "load_s", "skip_s", "resumed_step", "final_step",
    "max_abs_diff", "exact",
}
SMALL = QUICK["small"]


def _spec(tmp_path: Path, name: str, method: dict[str, Any], steps: int, workload: Workload = SMALL) -> Path:
    path = tmp_path / f"{name}.json"
    protocol.write_spec(
        path, workload, method, dir=str(tmp_path / "ckpt"), steps=steps, warmup=5, threads=1,
        out=str(tmp_path / f"{name}.result.json"), reference=str(tmp_path / "reference.npz"),
        started_at=time.time(), log=str(tmp_path / "events.jsonl"),
    )
    return path


def _command(case: str, spec: Path) -> list[str]:
    return [sys.executable, "-m", protocol.WORKERS["lightning"], case, "--spec", str(spec)]


def _run(case: str, spec: Path) -> dict[str, Any]:
    proc = subprocess.run(_command(case, spec), capture_output=True, text=True, timeout=300, cwd=spec.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if case == "goodput":
        return {}
    return json.loads(Path(protocol.read_spec(spec)[2]["out"]).read_text())


def _train_and_restore(tmp_path: Path, method: dict[str, Any], steps: int = 25) -> tuple[dict[str, Any], dict[str, Any]]:
    train = _run("train", _spec(tmp_path, "train", method, steps))
    restore = _run("restore", _spec(tmp_path, "restore", method, steps))
    return train, restore


@pytest.mark.parametrize("name", sorted(QUICK))
def test_models_match_param_count(name: str) -> None:
    from autockpt_bench.workers.lightning_models import StudyModule

    workload = QUICK[name]
    module = StudyModule(workload)
    assert sum(p.numel() for p in module.parameters() if p.requires_grad) == param_count(workload)


def test_a_model_that_disagrees_with_param_count_is_refused() -> None:
    from autockpt_bench.workers import lightning_models

    wrong = Workload("wrong", "mlp", {"features": 8, "width": 8, "layers": 1, "classes": 2}, batch=2, steps_per_epoch=1)
    original = lightning_models.param_count
    lightning_models.param_count = lambda w: original(w) + 1  # type: ignore[assignment]
    try:
        with pytest.raises(RuntimeError, match="disagree"):
            lightning_models.build_net(wrong)
    finally:
        lightning_models.param_count = original


def _check_train(result: dict[str, Any], method: str, checkpoints: list[int]) -> None:
    assert set(result) == TRAIN_KEYS | (REPORTED if method.startswith("autockpt") else set())
    assert result["framework"] == "lightning" and result["method"] == method and result["format"] == ".ckpt"
    assert result["params"] == param_count(SMALL)
    assert result["state_bytes"] >= 12 * param_count(SMALL)
    assert result["checkpoint_steps"] == checkpoints
    assert len(result["blocked_s"]) == len(result["save_s"]) == len(checkpoints)
    assert all(b >= 0 for b in result["blocked_s"])
    assert all(isinstance(s, float) and s > 0 for s in result["save_s"])
    assert result["checkpoint_bytes"] > result["params"] * 4
    assert 0 < result["step_s_median"] and 0 < result["step_s"]


def test_autockpt_train_then_restore_is_exact(tmp_path: Path) -> None:
    train, restore = _train_and_restore(tmp_path, {"name": "autockpt", "every": 10})
    _check_train(train, "autockpt", [10, 20])
    assert set(restore) == RESTORE_KEYS
    assert (restore["resumed_step"], restore["final_step"]) == (20, 25)
    assert restore["exact"] is True and restore["max_abs_diff"] == 0.0
    assert 0 < restore["load_s"] < restore["restore_s"]
    assert 0 < restore["imports_s"] < restore["restore_s"] and restore["skip_s"] is None


def test_modelcheckpoint_train_then_restore(tmp_path: Path) -> None:
    train, restore = _train_and_restore(tmp_path, {"name": "modelcheckpoint", "every": 10})
    _check_train(train, "modelcheckpoint", [10, 20])
    assert set(restore) == RESTORE_KEYS
    assert (restore["resumed_step"], restore["final_step"]) == (20, 25)
    assert isinstance(restore["exact"], bool) and isinstance(restore["max_abs_diff"], float)
    assert 0 < restore["load_s"] < restore["restore_s"]


@pytest.mark.slow
@pytest.mark.parametrize("method", [{"name": "async", "every": 10}, {"name": "autockpt-budget", "budget": 0.5}])
def test_other_train_methods(tmp_path: Path, method: dict[str, Any]) -> None:
    train, restore = _train_and_restore(tmp_path, method, steps=30)
    assert set(train) == TRAIN_KEYS | (REPORTED if method["name"].startswith("autockpt") else set())
    assert set(restore) == RESTORE_KEYS
    assert train["checkpoint_steps"] and len(train["save_s"]) == len(train["checkpoint_steps"])
    if method["name"] == "async":
        assert train["checkpoint_steps"] == [10, 20, 30]
    assert restore["resumed_step"] == train["checkpoint_steps"][-1] and restore["final_step"] == 30
    assert isinstance(restore["exact"], bool)


def _kill_then_finish(tmp_path: Path, method: dict[str, Any], steps: int, kill_after: int) -> list[dict[str, Any]]:
    """Start a goodput worker, SIGKILL it once it logged step ``kill_after``, rerun it to the end."""
    spec = _spec(tmp_path, "goodput", method, steps)
    log = tmp_path / "events.jsonl"
    proc = subprocess.Popen(_command("goodput", spec), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "step" and e["step"] >= kill_after for e in protocol.read_events(log)):
            assert proc.poll() is None, "the worker ended before it was killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not any(e["event"] == "done" for e in protocol.read_events(log))
    _run("goodput", spec)
    return protocol.read_events(log)


def _check_goodput(events: list[dict[str, Any]], steps: int) -> list[int]:
    names = [e["event"] for e in events]
    assert names[0] == "start" and names.count("start") == 2 and names.count("done") == 1 and names[-1] == "done"
    assert all(isinstance(e["t"], float) for e in events)
    resumed = [e["step"] for e in events if e["event"] == "resumed"]
    assert len(resumed) == 2 and resumed[0] == 0
    second = names.index("start", 1)
    assert max(e["step"] for e in events[:second] if e["event"] == "step") >= resumed[1]
    assert [e["step"] for e in events[second:] if e["event"] == "step"] == list(range(resumed[1] + 1, steps + 1))
    assert events[-1]["step"] == steps
    assert all(e["blocked_s"] >= 0 for e in events if e["event"] == "checkpoint")
    return resumed


def test_goodput_autockpt_survives_sigkill(tmp_path: Path) -> None:
    events = _kill_then_finish(tmp_path, {"name": "autockpt", "every": 10}, steps=120, kill_after=35)
    resumed = _check_goodput(events, 120)
    assert resumed[1] > 0 and resumed[1] % 10 == 0
    checkpoints = [e["step"] for e in events if e["event"] == "checkpoint"]
    assert resumed[1] in checkpoints and 60 not in checkpoints  # at an epoch's end: taken one step later
    assert isinstance(events[-1]["persist_s"], float)


@pytest.mark.slow
@pytest.mark.parametrize("method", [{"name": "every-epoch"}, {"name": "native-every-n", "every": 10}, {"name": "none"}])
def test_goodput_native_methods_survive_sigkill(tmp_path: Path, method: dict[str, Any]) -> None:
    events = _kill_then_finish(tmp_path, method, steps=180, kill_after=70)
    resumed = _check_goodput(events, 180)
    if method["name"] == "none":
        assert resumed[1] == 0
    else:
        assert resumed[1] % (60 if method["name"] == "every-epoch" else 10) == 0 and resumed[1] >= 60
    assert events[-1]["persist_s"] is None


def test_in_process_ab_takes_checkpoints_in_the_on_blocks_only(tmp_path: Path) -> None:
    # warm-up 5 (on: step 4), then blocks of 12: 6-17 on, 18-29 off, 30-41 on, 42-53 off
    method = {"name": "autockpt-ab", "every": 4, "block": 12, "budget": 0.02}
    train = _run("train", _spec(tmp_path, "train", method, 53))
    assert train["checkpoint_steps"] == [4, 8, 12, 16, 32, 36, 40]
    assert train["ab_block"] == 12 and train["ab_spill_steps"] >= 6  # the guard: half a block
    # steps of a few ms: a persist (the first starts the persist process) can outlast an off block, which
    # leaves that cycle no reference; the figures themselves are checked in test_in_process_ab
    assert len(train["ab_cycles"]) <= 2 and (train["ab_overhead"] is None) == (not train["ab_cycles"])
