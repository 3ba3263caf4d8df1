"""The contract both AutoCheckpoint callbacks keep: the same promise, tested the same way on each.

Every test runs once per adapter ("lightning", "keras" on its default TensorFlow backend) on a
tiny in-process fit from tests/contract/fits.py (5 batches of 8 per epoch), or, for signals, on
the fault-harness scripts of tests/fault/ in real processes, and, for one process failing, on two
real processes (Lightning DDP over gloo, Keras on JAX under jax.distributed).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autockpt_core import ConfigError, read_manifest, storage_for
from autockpt_core.run_status import KEYS, read_status
from tests.contract.fits import ADAPTERS
from tests.fault import harness

REPO = Path(__file__).resolve().parents[2]
BATCHES = 5  # per epoch: step 5 is the last batch of epoch 0, step 10 that of epoch 1


BOTH = [pytest.param("lightning", id="lightning"), pytest.param("keras", id="keras")]


def records(dirpath: Path) -> list[Any]:
    return read_manifest(storage_for(dirpath))


def steps(dirpath: Path) -> list[int]:
    return [r.step for r in records(dirpath)]


# -- 1. the final checkpoint -------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
def test_final_checkpoint_is_at_the_last_trained_step_and_latest_checkpoint_points_to_it(
    tmp_path: Path, adapter: str
) -> None:
    fits = ADAPTERS[adapter]
    dirpath = tmp_path / "ck"
    result = fits.fit(dirpath, epochs=2, every_n_steps=3, warmup_steps=0, verbose=False)
    assert result.end_step == 2 * BATCHES
    newest = records(dirpath)[-1]
    assert newest.step == result.end_step and newest.meta["reason"] == "end of training"
    assert (result.event_steps[-1], result.event_reasons[-1]) == (result.end_step, "end of training")
    assert fits.module.latest_checkpoint(dirpath) == str(dirpath / newest.name)


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
def test_the_status_file_follows_the_run_and_says_finished_at_its_end(tmp_path: Path, adapter: str) -> None:
    """``dirpath/autockpt-status.json`` read after every batch: training (or checkpointing) with
    the step, the last durable step and the next planned one; ``finished`` after the fit."""
    fits = ADAPTERS[adapter]
    dirpath = tmp_path / "ck"
    result = fits.fit(dirpath, epochs=2, every_n_steps=3, warmup_steps=0, verbose=False)
    during = [s for s in result.statuses if s is not None and s["last_durable_step"] is not None]
    assert during and set(KEYS) <= set(during[-1]), result.statuses
    assert all(s["state"] in ("training", "checkpointing") for s in during), during
    # step 9's checkpoint waits for step 6's persist: 6 is durable by then (9 may still be in flight)
    assert max(s["last_durable_step"] for s in during) in (6, 9) and during[-1]["pid"] == os.getpid()
    # a saving decision names no next step (None); any other names a later one
    assert all(s["next_checkpoint_step"] is None or s["next_checkpoint_step"] > s["step"] for s in during), during
    after = read_status(dirpath)
    assert after is not None and (after["state"], after["last_durable_step"]) == ("finished", result.end_step)


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
def test_without_save_on_train_end_no_checkpoint_is_taken_at_the_last_step(tmp_path: Path, adapter: str) -> None:
    fits = ADAPTERS[adapter]
    dirpath = tmp_path / "ck"
    result = fits.fit(dirpath, epochs=2, every_n_steps=3, warmup_steps=0, verbose=False, save_on_train_end=False)
    assert result.end_step == 10  # not a multiple of 3
    assert result.event_steps == [3, 6, 9] and steps(dirpath) == [3, 6, 9]
    assert fits.module.latest_checkpoint(dirpath) == str(dirpath / records(dirpath)[-1].name)


# -- 2. a non-finite last loss ------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("adapter", BOTH)
def test_a_non_finite_last_loss_takes_no_final_checkpoint_and_warns(tmp_path: Path, adapter: str, value: str) -> None:
    """One epoch of 10 batches whose last has non-finite targets: only the loss of step 10 is."""
    fits = ADAPTERS[adapter]
    dirpath = tmp_path / "ck"
    result = fits.fit(
        dirpath, epochs=1, batches=10, nonfinite_last_batch=float(value), every_n_steps=3, warmup_steps=0,
        verbose=False,
    )  # fmt: skip
    assert result.end_step == 10
    assert result.event_steps == [3, 6, 9] and steps(dirpath) == [3, 6, 9]
    expected = f"autockpt: no final checkpoint: the last loss is {value}; the newest checkpoint stays step 9"
    warned = [w for w in result.warnings if "no final checkpoint" in str(w.message)]
    assert [(w.category, str(w.message)) for w in warned] == [(RuntimeWarning, expected)]


# -- 3. a signal: exit 128 + n, a checkpoint where it stopped, a rerun resumes from it -----------------


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
@pytest.mark.parametrize("action", ["sigterm", "sigterm2"], ids=["once", "twice"])
def test_sigterm_exits_143_after_a_checkpoint_of_its_step_and_a_rerun_resumes_from_it(
    tmp_path: Path, adapter: str, action: str
) -> None:
    """The fault scripts (12 steps per epoch, 2 epochs, every 4 steps) get SIGTERM inside step 15,
    once, or twice 3 ms apart (Slurm's signal and torchrun's forward of it under srun + torchrun)."""
    fits = ADAPTERS[adapter]
    dirpath, out = tmp_path / "ck", tmp_path / "weights.npz"
    args = [*fits.script_args, "--epochs", "2", "--every", "4"]
    plan = {"phase": "step", "at": 14, "action": action}  # before step 15's update
    stopped = harness.run_once(fits.script, dirpath, out, plan, extra_args=args)
    context = stopped.describe() + "\n" + stopped.output[-3000:]
    assert stopped.events, "the signal was never sent:\n" + context
    assert stopped.returncode == 128 + signal.SIGTERM == 143, context
    assert not out.exists(), context  # training did not finish
    newest = records(dirpath)[-1]
    assert newest.step == 15, context  # not a multiple of 4: the emergency checkpoint
    assert newest.meta["reason"] == "preempted by SIGTERM", context
    assert "autockpt: SIGTERM received; checkpoint of step 15 committed" in stopped.output, context
    took = re.search(r"committed \(.*\) (\d+\.\d) s after the signal \(grace_period 30 s\)", stopped.output)
    assert took is not None and float(took.group(1)) < 30, context  # signal to durable, within the window
    status = read_status(dirpath)
    assert status is not None and (status["state"], status["last_durable_step"]) == ("preempted", 15), status

    rerun = harness.run_once(fits.script, dirpath, out, None, extra_args=args)
    context = rerun.describe() + "\n" + rerun.output[-3000:]
    assert rerun.returncode == 0 and out.exists(), context
    assert str(dirpath / newest.name) in rerun.output, context  # says it resumes from that file
    # From step 15 the rerun checkpoints at 16, 20 and 24 (from scratch it would take 6).
    assert "autockpt: 3 checkpoints," in rerun.output, context
    assert steps(dirpath)[-1] == 24, context
    assert read_status(dirpath)["state"] == "finished"  # type: ignore[index]


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
def test_ctrl_c_commits_its_step_and_exits_130_by_default(tmp_path: Path, adapter: str) -> None:
    """SIGINT to the process group inside step 15 (Ctrl-C in a terminal), default settings: the
    step is committed and the run exits 130 (no KeyboardInterrupt mid-step); the rerun resumes."""
    fits = ADAPTERS[adapter]
    dirpath, out = tmp_path / "ck", tmp_path / "weights.npz"
    args = [*fits.script_args, "--epochs", "2", "--every", "4"]
    stopped = harness.run_once(fits.script, dirpath, out, {"phase": "step", "at": 14, "action": "sigint"},
                               extra_args=args)
    context = stopped.describe() + "\n" + stopped.output[-3000:]
    assert stopped.events, "the signal was never sent:\n" + context
    assert stopped.returncode == 128 + signal.SIGINT == 130, context
    assert "KeyboardInterrupt" not in stopped.output, context
    newest = records(dirpath)[-1]
    assert (newest.step, newest.meta["reason"]) == (15, "preempted by SIGINT"), context
    assert "autockpt: SIGINT received; checkpoint of step 15 committed" in stopped.output, context
    assert "exiting with status 130" in stopped.output, context
    rerun = harness.run_once(fits.script, dirpath, out, None, extra_args=args)
    assert rerun.returncode == 0 and str(dirpath / newest.name) in rerun.output, rerun.output[-3000:]


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
def test_a_third_sigterm_ends_the_process_by_the_default_action(tmp_path: Path, adapter: str) -> None:
    """Three SIGTERMs 3 ms apart inside step 15: the third is not deferred (a stuck emergency
    checkpoint cannot hold a job), the process dies by SIGTERM, and what was committed before
    stays the newest checkpoint."""
    fits = ADAPTERS[adapter]
    dirpath, out = tmp_path / "ck", tmp_path / "weights.npz"
    args = [*fits.script_args, "--epochs", "2", "--every", "4"]
    stopped = harness.run_once(fits.script, dirpath, out, {"phase": "step", "at": 14, "action": "sigterm3"},
                               extra_args=args)  # fmt: skip
    context = stopped.describe() + "\n" + stopped.output[-3000:]
    assert stopped.events and stopped.returncode == -signal.SIGTERM, context
    assert "received again" in stopped.output and "no longer deferring it" in stopped.output, context
    newest = records(dirpath)[-1]  # an interval's checkpoint, no emergency one
    assert not out.exists() and newest.step < 15 and newest.meta.get("reason") != "preempted by SIGTERM", context


# -- 4. nothing left to train -------------------------------------------------------------------------


def _finish_then_rerun(fits: Any, dirpath: Path, verbose: bool) -> tuple[list[Any], Any]:
    first = fits.fit(dirpath, epochs=2, every_n_steps=3, warmup_steps=0, verbose=False)
    assert first.end_step == 10 and steps(dirpath)[-1] == 10
    before = records(dirpath)
    return before, fits.fit(dirpath, epochs=2, every_n_steps=3, warmup_steps=0, verbose=verbose)


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
def test_rerunning_a_finished_fit_trains_nothing_takes_no_checkpoint_and_says_so(
    tmp_path: Path, adapter: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dirpath = tmp_path / "ck"
    before, again = _finish_then_rerun(ADAPTERS[adapter], dirpath, verbose=True)
    assert again.start_step == again.end_step == 10  # resumed at the end, not one step trained
    assert again.event_steps == [] and records(dirpath) == before
    lines = [line for line in capsys.readouterr().out.splitlines() if "autockpt: nothing left to train" in line]
    assert len(lines) == 1 and "step 10" in lines[0], lines


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
def test_nothing_left_to_train_is_logged_without_verbose(
    tmp_path: Path, adapter: str, caplog: pytest.LogCaptureFixture
) -> None:
    dirpath = tmp_path / "ck"
    with caplog.at_level(logging.INFO, logger="autockpt"):
        _, again = _finish_then_rerun(ADAPTERS[adapter], dirpath, verbose=False)
    assert again.start_step == again.end_step == 10
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("autockpt")]
    assert any("nothing left to train" in m and "step 10" in m for m in logged), logged


# -- 5. from_config with overrides --------------------------------------------------------------------


@pytest.mark.parametrize("adapter", BOTH)
@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_from_config_with_overrides(tmp_path: Path, adapter: str, suffix: str) -> None:
    from autockpt_core import Config

    fits = ADAPTERS[adapter]
    path = tmp_path / f"autockpt{suffix}"
    if suffix == ".yaml":
        path.write_text("autockpt:\n  dirpath: from-file\n  overhead_budget: 3%\n  keep_last: 7\n  every_n_steps: 4\n")
    else:
        path.write_text("[autockpt]\ndirpath = 'from-file'\noverhead_budget = '3%'\nkeep_last = 7\nevery_n_steps = 4\n")
    auto = fits.module.AutoCheckpoint.from_config(path, save_on_train_end=False, keep_last=2)
    assert type(auto) is fits.module.AutoCheckpoint
    assert auto.save_on_train_end is False
    assert auto.config == Config.from_file(path, keep_last=2)  # the file's settings, the override winning
    assert (auto.config.dirpath, auto.config.overhead_budget, auto.config.keep_last, auto.config.every_n_steps) == (
        "from-file", 0.03, 2, 4,
    )  # fmt: skip
    default = fits.module.AutoCheckpoint.from_config(path)
    assert default.save_on_train_end is True and default.config.keep_last == 7
    with pytest.raises(ConfigError, match="keep_lats=2: is not a keyword of AutoCheckpoint. Fix: did you mean 'keep_last'"):
        fits.module.AutoCheckpoint.from_config(path, keep_lats=2)  # a misspelt override is not ignored


# -- 6. a checkpoint due where a resume cannot continue exactly ---------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
def test_a_checkpoint_due_at_an_epochs_last_batch_is_taken_by_the_next_step(tmp_path: Path, adapter: str) -> None:
    """every_n_steps=5 with 5 batches per epoch: step 5 ends epoch 0. Lightning cannot resume
    exactly from there and takes it at step 6; Keras takes the state of step 5 after the epoch
    ended (in the next on_epoch_begin), from where it resumes exactly. Either way it is not lost
    and lies in epoch 1's resume point, before the next one falls due."""
    fits = ADAPTERS[adapter]
    dirpath = tmp_path / "ck"
    result = fits.fit(dirpath, epochs=2, every_n_steps=5, warmup_steps=0, keep_last=10, verbose=False)
    assert result.event_steps[0] in (BATCHES, BATCHES + 1), result.event_steps
    assert result.event_reasons[0].startswith("every_n_steps=5"), result.event_reasons
    assert steps(dirpath) == result.event_steps and len(result.event_steps) == 2  # that one, and step 10


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
def test_a_checkpoint_due_at_the_last_step_is_taken_without_save_on_train_end(tmp_path: Path, adapter: str) -> None:
    fits = ADAPTERS[adapter]
    dirpath = tmp_path / "ck"
    result = fits.fit(
        dirpath, epochs=2, every_n_steps=5, warmup_steps=0, keep_last=10, verbose=False, save_on_train_end=False
    )
    assert result.end_step == 10
    assert steps(dirpath)[-1] == 10, steps(dirpath)


# -- 7. one process failing: every process stops with its message ------------------------------------


def _lightning_ddp_persist_error(tmp_path: Path) -> tuple[int, str, str, str]:
    """DDP on two gloo ranks (tests/fault/lightning_ddp_script.py): rank 0's writes fail from the
    second checkpoint on. Each rank reports in its own result file."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fault.lightning_ddp_script", str(tmp_path), "30", "persist-error"],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )  # fmt: skip
    reports = [tmp_path / f"result-rank{rank}.txt" for rank in (0, 1)]
    first, second = (r.read_text() if r.exists() else "" for r in reports)
    return proc.returncode, first, second, proc.stdout[-3000:] + proc.stderr[-3000:]


def _keras_jax_persist_error(tmp_path: Path) -> tuple[int, str, str, str]:
    """Keras on JAX over two processes (jax.distributed, tests/fault/keras_script.py): process
    0's second checkpoint write fails. Both processes print to the one output."""
    pytest.importorskip("jax")
    args = ["--backend", "jax", "--strategy", "jaxdist", "--inputs", "arrays", "--val", "--epochs", "3", "--every", "2"]
    plan = {"phase": "persist", "nth": 2, "action": "enospc"}
    command = [sys.executable, "-m", "tests.fault.keras_script"]
    attempt = harness.run_once(command, tmp_path / "ck", tmp_path / "w.npz", plan, extra_args=args)
    return attempt.returncode, attempt.output, attempt.output, attempt.output[-3000:]


@pytest.mark.integration
@pytest.mark.parametrize(
    "adapter, run, member, first_step",
    [
        pytest.param("lightning", _lightning_ddp_persist_error, "rank", 5, id="lightning"),
        pytest.param("keras", _keras_jax_persist_error, "process", 2, id="keras"),
    ],
)
def test_a_failed_write_on_process_0_stops_every_process_with_its_message(
    tmp_path: Path, adapter: str, run: Any, member: str, first_step: int
) -> None:
    """Two real processes; process 0's writes fail (ENOSPC) from its second checkpoint on. Neither
    hangs: process 0 raises its CheckpointWriteError, the other a PeerFailedError with its message,
    and the first checkpoint stays the newest, with nothing of the failed one left."""
    code, first, second, report = run(tmp_path)
    assert code != 0, report
    assert "CheckpointWriteError" in first and "No space left on device" in first, report
    expected = f"PeerFailedError: autockpt: {member} 0 stopped training, so every {member} stops: CheckpointWriteError"
    assert expected in second, second[-3000:]
    assert steps(tmp_path / "ck") == [first_step], report
    assert not list((tmp_path / "ck").glob(".autockpt-tmp*"))
    assert not (tmp_path / "w.npz").exists()  # training did not finish


# -- the manifest's epoch --------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("adapter", BOTH)
def test_each_checkpoint_records_the_epoch_its_step_was_trained_in(tmp_path: Path, adapter: str) -> None:
    """The manifest record's and the CheckpointEvent's ``epoch`` (``autockpt inspect`` shows it):
    0-based, the epoch of the checkpoint's step, in both adapters."""
    fits = ADAPTERS[adapter]
    dirpath = tmp_path / "ck"
    result = fits.fit(dirpath, epochs=2, every_n_steps=3, warmup_steps=0, keep_last=10, verbose=False)
    assert result.event_steps == [3, 6, 9, 10]
    expected = [(step, (step - 1) // BATCHES) for step in result.event_steps]  # 0-based epoch of each step
    assert [(r.step, r.epoch) for r in records(dirpath)] == expected
    assert list(zip(result.event_steps, result.event_epochs)) == expected
