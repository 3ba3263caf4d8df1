"""Parent side of the fault harness: run a training script, break it, rerun it until it finishes.

Framework-neutral (stdlib, numpy, autockpt_core). The Lightning tests use it with
``lightning_script.py``, the core tests with ``toy_script.py``; a Keras script plugs in the same way.

Script contract
---------------
``python SCRIPT DIRPATH OUT [--baseline] [extra args]``

- trains from a fixed seed, checkpointing into ``DIRPATH`` with the autockpt callback and
  resuming from it automatically (rerunning the same command is how a crash is recovered);
- ``--baseline``: the same training without the callback (the reference run);
- when training finished, writes the final weights to ``OUT`` as ``.npz`` (``np.savez``;
  one array per parameter name) and exits 0; a preempted run exits with ``128 + signum``
  (``autockpt_core.preemption.exit_code``) without writing ``OUT``;
- reads its fault from the environment with ``tests.fault.child.FaultPlan.from_env()``
  and reports phases: ``plan.hit("step", step=s)`` inside each training step,
  ``plan.hit("snapshot")`` inside the snapshot, and uses ``child.FaultStorage`` as the
  callback's storage for the persist, commit and retention phases;
- sets one CPU thread and deterministic settings, so two uninterrupted runs are bitwise equal.

Typical test::

    baseline = run_baseline([sys.executable, SCRIPT], tmp_path)
    result = run_until_done([sys.executable, SCRIPT], tmp_path / "ckpts", tmp_path / "w.npz",
                            plans=[{"phase": "snapshot", "nth": 2}, {"phase": "persist", "nth": 2}])
    result.assert_faults_happened()
    assert_weights_equal(result.weights, baseline)

Timing: no assertion depends on time; ``kill_after`` (an external SIGKILL after a random
delay) only makes the fault land at an unpredictable point, the assertions stay the same.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from autockpt_core import read_manifest, storage_for

from .child import KILL_JOB_ENV, LOG_ENV, PLAN_ENV

REPO = Path(__file__).resolve().parents[2]

Plan = dict[str, Any]


@dataclasses.dataclass
class Attempt:
    """One process: its fault plan, what the child logged, how it ended."""

    plan: Plan | None
    returncode: int
    events: list[dict[str, Any]]
    output: str
    newest_step: int | None  # newest checkpoint in the manifest after this process ended
    killed_externally: bool = False

    @property
    def fault_happened(self) -> bool:
        return self.killed_externally or bool(self.events) or self.plan is None

    def describe(self) -> str:
        return f"plan={self.plan} rc={self.returncode} events={self.events} newest={self.newest_step}"


@dataclasses.dataclass
class FaultRun:
    """All attempts of one run-until-done, and the final weights."""

    attempts: list[Attempt]
    weights: dict[str, np.ndarray]

    def assert_faults_happened(self) -> None:
        """Every planned fault fired where planned (the child logged it before acting).

        A planned process that finished first (possible with ``require_all=False``) is skipped.
        """
        for attempt in self.attempts:
            if attempt.returncode == 0 and not attempt.events:
                continue
            assert attempt.fault_happened, "planned fault never fired: " + attempt.describe()
            for event in attempt.events:
                assert attempt.plan is not None and event["phase"] == attempt.plan["phase"], attempt.describe()

    def report(self) -> str:
        return "\n".join(a.describe() for a in self.attempts)


def script_env(plan: Plan | None, log_path: Path | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child: repo on the path, one thread, the fault plan."""
    env = dict(os.environ)
    env.pop(PLAN_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
    env["PYTHONFAULTHANDLER"] = "1"  # an abort or a crash prints every thread's Python stack
    env[KILL_JOB_ENV] = "1"  # a planned kill takes the child's whole process group (every rank)
    if plan is not None:
        env[PLAN_ENV] = json.dumps(plan)
    if log_path is not None:
        env[LOG_ENV] = str(log_path)
    env.update(extra or {})
    return env


def newest_step(dirpath: Path) -> int | None:
    """Step of the newest record in the manifest (None: no manifest or no record)."""
    try:
        records = read_manifest(storage_for(dirpath))
    except ValueError:
        return None
    return records[-1].step if records else None


def run_once(
    command: Sequence[str],
    dirpath: Path,
    out: Path,
    plan: Plan | None = None,
    *,
    extra_args: Sequence[str] = (),
    kill_after: float | None = None,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
) -> Attempt:
    """Run the script once with ``plan``; ``kill_after``: SIGKILL it after that many seconds."""
    log_path = Path(str(out) + ".faults.jsonl")
    if log_path.exists():
        log_path.unlink()
    args = [*command, str(dirpath), str(out), *extra_args]
    # Its own process group: the ranks and persist processes it starts are killed with it.
    proc = subprocess.Popen(
        args,
        cwd=REPO,
        env=script_env(plan, log_path, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    killed = False
    try:
        if kill_after is not None:
            try:
                output, _ = proc.communicate(timeout=kill_after)
            except subprocess.TimeoutExpired:
                kill_job(proc.pid)  # every process of the job at once, as torchrun tears it down
                killed = True
                output, _ = proc.communicate(timeout=timeout)
        else:
            output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc.pid)
        output, _ = proc.communicate()
        raise AssertionError(f"{args} did not finish within {timeout} s:\n{output[-3000:]}") from None
    finally:
        kill_job(proc.pid)  # a rank left behind by one that died must not outlive the attempt
    events = []
    if log_path.exists():
        events = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    return Attempt(plan, proc.returncode, events, output, newest_step(dirpath), killed and proc.returncode == -9)


def kill_job(group: int) -> None:
    """SIGKILL every process left in the process group ``group`` (none left: nothing to do)."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_until_done(
    command: Sequence[str],
    dirpath: Path,
    out: Path,
    plans: Sequence[Plan | None] = (),
    *,
    kill_after: Sequence[float] = (),
    extra_args: Sequence[str] = (),
    max_clean_reruns: int = 3,
    timeout: float = 300.0,
    require_all: bool = True,
    before_attempt: Callable[[int], None] | None = None,
) -> FaultRun:
    """One process per plan (each must fail as planned), then external kills, then clean reruns.

    ``before_attempt(i)`` is called before the i-th process starts (0 first): e.g. to swap
    ``dirpath`` for another node's disk.

    A planned process that finishes (exit 0) before its fault fired fails the run (with
    ``require_all=False``, for random plans, it ends the run instead). After the
    faults, the same command is rerun without a fault until it exits 0 (preempted and failed
    runs are rerun too); the final weights are then read from ``out``.
    """
    if out.exists():
        out.unlink()
    attempts: list[Attempt] = []

    def attempt_with(plan: Plan | None, kill_after: float | None = None) -> Attempt:
        if before_attempt is not None:
            before_attempt(len(attempts))
        return run_once(command, dirpath, out, plan, extra_args=extra_args, kill_after=kill_after, timeout=timeout)

    for plan in plans:
        attempt = attempt_with(plan)
        attempts.append(attempt)
        if attempt.returncode == 0 and not require_all:
            break
        assert attempt.returncode != 0, (
            "the run finished before its planned fault:\n" + attempt.describe() + "\n" + attempt.output[-3000:]
        )
    for delay in kill_after:
        if out.exists():
            break
        attempt = attempt_with(None, kill_after=delay)
        attempts.append(attempt)
        if attempt.returncode == 0:
            break  # finished before the kill: nothing left to break
    for _ in range(max_clean_reruns):
        if out.exists():
            break
        attempt = attempt_with(None)
        attempts.append(attempt)
        if attempt.returncode == 0:
            break
    assert out.exists(), "the script never finished:\n" + "\n".join(
        a.describe() + "\n" + a.output[-2000:] for a in attempts[-2:]
    )
    return FaultRun(attempts, load_weights(out))


def run_baseline(
    command: Sequence[str], workdir: Path, extra_args: Sequence[str] = (), timeout: float = 300.0
) -> dict[str, np.ndarray]:
    """The uninterrupted run without the callback (``--baseline``); returns its final weights."""
    out = workdir / "baseline.npz"
    attempt = run_once(
        command, workdir / "baseline-unused", out, None, extra_args=["--baseline", *extra_args], timeout=timeout
    )
    assert attempt.returncode == 0 and out.exists(), f"rc={attempt.returncode}\n{attempt.output[-3000:]}"
    return load_weights(out)


def load_weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k].copy() for k in data.files}


def assert_weights_equal(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Bitwise equality (same names, dtypes, shapes and bytes; NaN-safe)."""
    assert sorted(actual) == sorted(expected)
    for name in expected:
        a, b = actual[name], expected[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), (
            f"{name} differs: max |diff| {np.max(np.abs(a.astype(float) - b.astype(float)))}"
        )


def newest_file(dirpath: Path) -> Path:
    """The newest committed checkpoint file."""
    records = read_manifest(storage_for(dirpath))
    assert records, f"no checkpoint in {dirpath}"
    return dirpath / records[-1].name


def corrupt_newest(dirpath: Path, mode: str) -> Path:
    """Damage the newest committed checkpoint: ``"truncate"`` (drop its second half) or ``"bitflip"``."""
    path = newest_file(dirpath)
    data = bytearray(path.read_bytes())
    if mode == "truncate":
        data = data[: len(data) // 2]
    elif mode == "bitflip":
        data[len(data) // 2] ^= 0x10
    else:
        raise ValueError(f"unknown corruption {mode!r}")
    path.write_bytes(bytes(data))
    return path
