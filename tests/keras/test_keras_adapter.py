"""The Keras adapter on the TensorFlow, torch and JAX backends.

Each backend runs ``scenario.py`` in two fresh interpreters (the backend is fixed at import):
``first`` trains for 2 epochs, ``resume`` reruns with 4 epochs in the same directories. The
scenarios write JSON; these tests only read it. No timing assertions.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autockpt_keras.input_checks import loads_ahead

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("scenario.py")
BACKENDS = ["tensorflow", "torch", "jax"]
#: Why scenario.py runs no DataLoader with workers on JAX.
WORKERS_SKIPPED = "a DataLoader's workers fork, and JAX's threads do not allow it"


def _run_phase(backend: str, phase: str, workdir: Path) -> dict[str, Any]:
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TF_NUM_INTRAOP_THREADS="1",
        TF_NUM_INTEROP_THREADS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), phase, str(workdir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    out = workdir / f"{phase}.json"
    assert out.exists(), f"{backend}/{phase} wrote no result (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(out.read_text())
    assert "error" not in result, f"{backend}/{phase} failed:\n{result['error']}"
    assert result["backend"] == backend
    return result


@pytest.fixture(scope="module", params=BACKENDS)
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if importlib.util.find_spec(request.param) is None:
        pytest.skip(f"{request.param} is not installed")
    workdir = tmp_path_factory.mktemp(f"keras-{request.param}")
    first = _run_phase(request.param, "first", workdir)
    resume = _run_phase(request.param, "resume", workdir)
    return {"first": first, "resume": resume}


def test_all_is_exactly_the_public_api(results: dict[str, Any]) -> None:
    api = results["first"]["api"]
    assert api["all"] == api["public"]
    assert {"AutoCheckpoint", "latest_checkpoint", "export_weights", "restore"} <= set(api["all"])


def test_bad_config_raises_config_error_at_construction(results: dict[str, Any]) -> None:
    config = results["first"]["config"]
    for field, raised_for in config["raised"].items():
        expected = "overhead_budjet" if field == "file" else field
        assert raised_for == expected, f"{field}: no ConfigError naming it"
    assert config["from_file"] == {"dirpath": "from-yaml", "budget": 0.03, "keep_last": 5}


def test_keys_are_unique_and_deterministic(results: dict[str, Any]) -> None:
    assert results["first"]["config"]["unique_keys"] == ["a", "b", "a#2", "a#2#2", "a#3"]


def test_by_default_the_epoch_logs_and_so_the_progress_bar_get_no_autockpt_keys(results: dict[str, Any]) -> None:
    for phase in ("first", "resume"):
        history = results[phase]["mid"]["history"]
        assert "loss" in history and not [k for k in history if k.startswith("autockpt")], (phase, sorted(history))


def test_with_log_metrics_history_has_the_autockpt_keys_every_epoch(results: dict[str, Any]) -> None:
    for phase, epochs in (("first", 2), ("resume", 2)):
        run = results[phase]["run"]
        for key in results[phase]["log_keys"]:
            assert len(run["history"][key]) == epochs, (phase, key)
        assert run["history"]["autockpt_checkpoints"][-1] == len(
            [e for e in run["events"] if e["reason"] != "end of training"]
        )
        assert all(v == 3.0 for v in run["history"]["autockpt_interval_steps"])


def test_every_n_steps_spacing_is_exact(results: dict[str, Any]) -> None:
    first = [e["step"] for e in results["first"]["run"]["events"] if e["reason"].startswith("every_n_steps")]
    resumed = [e["step"] for e in results["resume"]["run"]["events"] if e["reason"].startswith("every_n_steps")]
    assert first == [3, 6, 9, 12, 15, 18]
    assert resumed == [21, 24, 27, 30, 33, 36, 39]
    finals = [(e["step"], e["next_epoch"]) for e in results["first"]["run"]["events"] if e["reason"] == "end of training"]
    assert finals == [(20, 2)]


def test_the_hooks_own_time_is_measured_at_every_step(results: dict[str, Any]) -> None:
    for run in ("first", "resume"):
        hook_s = results[run]["run"]["hook_s"]
        assert hook_s is not None and 0 < hook_s < 0.5, (run, hook_s)  # measured, and no whole step


def test_checkpoints_are_written_by_the_persist_process(results: dict[str, Any]) -> None:
    run = results["resume"]["run"]  # waited for the process to be ready before training
    if sys.platform != "linux":
        pytest.skip("the persist process needs Linux (memfd_create)")
    assert run["persist_mode"] == "process"
    assert run["process_writes"] == len(run["events"]) == 8  # seven every_n_steps, one final


def test_checkpoint_files_are_standard_safetensors(results: dict[str, Any]) -> None:
    files = results["first"]["run_files"]
    assert [f["step"] for f in files] == [3, 6, 9, 12, 15, 18, 20]
    for f in files:
        assert f["name"].endswith(".safetensors")
        assert f["iteration_value"] == f["step"]  # optimizer.iterations is the global step
        assert f["meta"]["format"] == "autockpt-keras"
        assert f["meta"]["step"] == str(f["step"])
        assert f["meta"]["backend"] == results["first"]["backend"]
        assert sorted(json.loads(f["meta"]["variables"])) == f["keys"]
        keys = f["keys"]
        assert "model/net/hidden/kernel" in keys
        assert "model/net/bn/moving_mean" in keys  # non-trainable
        assert any(k.endswith("seed_generator_state") for k in keys)  # dropout RNG state
        assert "optimizer/adam/iteration" in keys
        assert any(k.startswith("optimizer/adam/") and k.endswith("_momentum") for k in keys)
        assert "metrics/loss/total" in keys


def test_rerun_resumes_with_restored_state_at_the_next_epoch(results: dict[str, Any]) -> None:
    run = results["resume"]["run"]
    assert run["restored"]["step"] == 20 and run["restored"]["next_epoch"] == 2
    assert run["iterations_at_begin"] == 20
    assert run["restore_compared"] > 0 and run["restore_mismatched"] == []
    assert run["epochs"] == [2, 3]
    assert run["batch_end_steps"][0] == 21
    assert run["iterations_at_end"] == 40


def test_the_resume_reads_its_checkpoint_file_once(results: dict[str, Any]) -> None:
    """Verified and parsed from one read (autockpt_core.persist.whole_read), no second pass."""
    for case, name in (("run", "ckpt-step000000020.safetensors"), ("mid", "ckpt-step000000018.safetensors")):
        assert results["resume"][case]["checkpoint_reads"] == [name], case


def test_mid_epoch_checkpoint_resumes_at_the_next_batch(results: dict[str, Any]) -> None:
    assert results["first"]["mid"]["latest"].endswith("ckpt-step000000018.safetensors")
    mid = results["resume"]["mid"]
    assert mid["restored"]["step"] == 18 and mid["restored"]["next_epoch"] == 1
    assert mid["restored"]["batches_done"] == 8  # step 18 = epoch 1, batch 7
    assert mid["restore_mismatched"] == []
    assert mid["epochs"] == [1, 2, 3]
    # Batches 0..7 of epoch 1 are drawn but not trained (the step stays 18), then training goes on.
    assert mid["batch_end_steps"][:9] == [18] * 8 + [19]
    assert mid["iterations_at_end"] == 40  # as many steps as an uninterrupted 4-epoch run


@pytest.mark.parametrize(
    "name", ["pyds", "pyds-augment", "loader", "loader-augment", "workers", "workers-augment", "arrays"]
)
def test_an_indexed_input_resume_skips_by_index_and_stays_exact(results: dict[str, Any], name: str) -> None:
    """A PyDataset (pyds), a torch DataLoader (loader) or one with 2 worker processes (workers;
    not on JAX), or shuffled arrays (torch backend only), resumed at step 18 (epoch 1,
    8 batches trained): the 8 skipped batches load one, except where the load draws from a
    global generator (numpy's, torch's) in a thread or process that loads ahead (tf.data's on
    TensorFlow, a DataLoader's workers on every backend), so the draws must stay in sequence:
    there all 8 load. Either way the weights end as the uninterrupted 4-epoch run's."""
    backend = results["first"]["backend"]
    if name.startswith("workers") and backend == "jax":
        pytest.skip(WORKERS_SKIPPED)
    if name == "arrays" and backend != "torch":
        pytest.skip("arrays are drawn on this backend (sliced in tf.data's graph or a generator of Keras' own)")
    first, resumed = results["first"], results["resume"][name]
    assert resumed["restored_step"] == 18 and resumed["plan"] == {"by_index": True, "reason": ""}
    assert resumed["digest"] == first[f"{name}-whole"]["digest"]
    assert any(", batch 9: the 8 batch(es) already trained are skipped by index, only the first" in line for line in resumed["printed"])
    replays_draws = name.endswith("-augment") and (loads_ahead(backend) or name.startswith("workers"))
    assert resumed["skip"] == ({"served": 0, "loaded": 8} if replays_draws else {"served": 7, "loaded": 1})
    said = [line for line in resumed["printed"] if "global generator" in line]
    assert len(said) == (1 if replays_draws else 0), resumed["printed"]


def test_the_step_is_read_from_the_device_once_per_epoch_not_per_batch(results: dict[str, Any]) -> None:
    """At the fit's start and each epoch's start (each read waits for a GPU); counted between."""
    first, resumed = results["first"]["run"], results["resume"]["run"]
    assert first["iteration_reads"] == [0, 0, 10]  # 2 epochs of 10 batches
    assert resumed["iteration_reads"] == [20, 20, 30]  # resumed at epoch 2 of 4
    assert [e["step"] for e in first["events"]][-1] == first["iterations_at_end"] == 20
    mid = results["resume"]["mid"]  # resumed mid-epoch at step 18: the drawn batches are not counted
    assert [e["step"] for e in mid["events"]] == list(range(21, 40, 3)) and mid["iterations_at_end"] == 40


def test_the_policy_learns_the_planned_end_at_each_epoch_start(results: dict[str, Any]) -> None:
    """epochs x batches per epoch; none without a final checkpoint (the end rule needs one)."""
    assert results["first"]["run"]["planned_end"] == 20
    assert results["resume"]["run"]["planned_end"] == 40
    assert results["first"]["mid"]["planned_end"] is None  # save_on_train_end=False


def test_steps_the_optimizer_skipped_still_count_and_steps_only_increase(results: dict[str, Any]) -> None:
    """A LossScaleOptimizer skips its first, overflowing steps (3 or 4, by backend): iterations
    ends behind the 20 batches trained; the steps count batches and go on from 20 after a resume."""
    first, resumed = results["first"]["loss_scaled"], results["resume"]["loss_scaled"]
    assert 0 < first["iterations_at_end"] < 20
    assert first["steps"][-1] == 20 and first["steps"] == sorted(set(first["steps"]))
    assert resumed["resumed_from"] == 20
    assert resumed["iterations_at_end"] < 40
    assert min(resumed["steps"]) > 20 and resumed["steps"][-1] == 40
    assert resumed["manifest_steps"] == sorted(set(resumed["manifest_steps"]))


def test_constructor_mirrors_every_config_field(results: dict[str, Any]) -> None:
    assert results["first"]["keywords"] == {"missing": [], "wrong_default": []}


def test_callback_does_not_change_training(results: dict[str, Any]) -> None:
    assert results["first"]["run"]["events"], "the seeded run took no checkpoint"
    assert results["first"]["same"]["equal"], "seeded training with AutoCheckpoint ended with other weights"


def test_preemption_signal_commits_a_checkpoint_and_continues(results: dict[str, Any]) -> None:
    usr1 = results["first"]["usr1"]
    assert usr1["preempted"] == {"step": 6, "signal": "SIGUSR1"}  # signalled before step 6's update
    assert "preempted by SIGUSR1" in [reason for _, reason, _ in usr1["events"]]
    assert usr1["manifest_steps"][0] == 6
    assert usr1["iterations"] == 10  # on_preempt="continue": the epoch ran to its end
    assert usr1["handler_restored"]


def test_unseeded_shuffle_warns_with_the_reason_on_tensorflow(results: dict[str, Any]) -> None:
    messages = results["first"]["usr1"]["not_exact_warnings"]
    if results["first"]["backend"] == "tensorflow":
        assert any("tf.random.shuffle" in m and "set_random_seed" in m for m in messages), messages
    else:  # shuffled arrays on torch and JAX: the global generator that shuffles is restored
        assert messages == []


def test_every_global_generator_is_captured_and_restored(results: dict[str, Any]) -> None:
    state = results["first"]["rng"]
    assert state["equal"]
    backend = results["first"]["backend"]
    expected = {"python", "numpy", "keras_seed"} | {"tensorflow": {"tf_global"}, "torch": {"torch"}}.get(backend, set())
    assert expected <= set(state["components"]), state["components"]


def test_input_inspection_names_what_is_not_reproducible(results: dict[str, Any]) -> None:
    checks = results["first"]["inputs"]
    assert any("could not find fit()'s data iterator" in p for p in checks["no_iterator"])
    if results["first"]["backend"] == "tensorflow":
        assert checks["seeded"] == {"problems": [], "reshuffles": True}
        assert any("unseeded ShuffleDataset" in p for p in checks["unseeded_shuffle"]["problems"])
        assert any("unseeded RandomUniform" in p for p in checks["unseeded_op"]["problems"])
        assert any("deterministic=False" in p for p in checks["nondeterministic"]["problems"])
        assert any("tf.random.Generator" in p for p in checks["generator"]["problems"])
    elif results["first"]["backend"] == "torch":
        assert checks["global_generator"] == []
        assert any("own generator" in p for p in checks["own_generator"])


def test_storage_failure_surfaces_in_training_thread_and_keeps_previous(results: dict[str, Any]) -> None:
    failure = results["first"]["failure"]
    assert failure["raised"] == "CheckpointWriteError"
    assert "No space left on device" in failure["message"] and "step 6" in failure["message"]
    assert failure["event_steps"] == [2, 4, 6]
    assert failure["latest"].endswith("ckpt-step000000004.safetensors")
    assert failure["files"] == [
        "autockpt-manifest.json", "autockpt-status.json", "ckpt-step000000002.safetensors",
        "ckpt-step000000004.safetensors",
    ]


def test_restore_and_export_weights_outside_fit(results: dict[str, Any]) -> None:
    outside = results["resume"]["outside"]
    assert outside == {"restore_step": 40, "iterations": 40, "kernel_equal": True, "export_weights_equal": True}

