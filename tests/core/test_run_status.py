"""``dirpath/autockpt-status.json``: the states, when it is written, what it holds, and the
session that keeps it current (``autockpt_core.run_status``)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from autockpt_core import CheckpointSession, CheckpointWriteError, Config
from autockpt_core.policy import Estimates
from autockpt_core.run_status import KEYS, STATUS_NAME, StatusFile, read_status
from tests.core.test_session import FakeClock, make_snapshot, run
from tests.faults import FailingStorage


class Clocks:
    def __init__(self) -> None:
        self.mono = 0.0
        self.wall = 1_800_000_000.0


def status_file(tmp_path: Path, clocks: Clocks, every_s: float = 5.0) -> StatusFile:
    return StatusFile(tmp_path / STATUS_NAME, every_s=every_s, wall=lambda: clocks.wall, clock=lambda: clocks.mono)


def test_figures_and_keys(tmp_path: Path) -> None:
    clocks = Clocks()
    status = status_file(tmp_path, clocks)
    status.report("training", 100, run="r1", estimates=Estimates(iter_time_s=0.05, stall_s=0.5, persist_s=1.0),
                  next_step=150)
    status.durable(80, created=1_799_999_990.0)
    data = read_status(tmp_path)
    assert data is not None and set(data) == set(KEYS)
    assert (data["state"], data["step"], data["last_durable_step"], data["next_checkpoint_step"]) == ("training", 100, 80, 150)
    assert data["work_at_risk_s"] == pytest.approx(20 * 0.05) and data["emergency_checkpoint_s"] == 1.5
    assert (data["last_durable_time"], data["updated"], data["run"], data["pid"]) == (1_799_999_990.0, clocks.wall, "r1", os.getpid())


@pytest.mark.parametrize(
    ("reports", "written"),
    [
        ([("training", 0.0), ("training", 1.0), ("training", 4.9)], 1),  # within every_s: once
        ([("training", 0.0), ("training", 5.0), ("training", 10.0)], 3),  # every_s apart: each
        ([("training", 0.0), ("checkpointing", 0.1), ("training", 0.2)], 3),  # a state change: at once
    ],
)
def test_written_on_a_state_change_else_at_most_every_few_seconds(
    tmp_path: Path, reports: list[tuple[str, float]], written: int
) -> None:
    clocks = Clocks()
    status = status_file(tmp_path, clocks)
    updates = []
    for step, (state, at) in enumerate(reports, start=1):
        clocks.mono, clocks.wall = at, 1_800_000_000.0 + at
        status.report(state, step)
        updates.append(read_status(tmp_path)["updated"])  # type: ignore[index]
    assert len(set(updates)) == written


def test_a_commit_is_always_written_and_ends_checkpointing(tmp_path: Path) -> None:
    clocks = Clocks()
    status = status_file(tmp_path, clocks)
    status.report("checkpointing", 10)
    status.durable(10, created=1.0)
    status.durable(7, created=2.0)  # an older one committed later (not in order): the newest stays
    data = read_status(tmp_path)
    assert data["state"] == "training" and data["last_durable_step"] == 10 and data["last_durable_time"] == 1.0  # type: ignore[index]


@pytest.mark.parametrize(("ending", "final"), [("finished", "finished"), ("failed", "failed")])
def test_the_end_is_final_and_preempted_stays(tmp_path: Path, ending: str, final: str) -> None:
    clocks = Clocks()
    status = status_file(tmp_path, clocks)
    status.report("training", 5)
    status.end(ending)
    status.report("training", 6)  # after the end: ignored
    assert read_status(tmp_path)["state"] == final  # type: ignore[index]
    preempted = status_file(tmp_path / "p", clocks) if (tmp_path / "p").mkdir() is None else None
    assert preempted is not None
    preempted.report("preempted", 9)
    preempted.end(ending)  # the session's close after the emergency checkpoint
    assert read_status(tmp_path / "p")["state"] == "preempted"  # type: ignore[index]


def test_no_path_no_file_and_a_failed_write_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    StatusFile(None).report("training", 1)  # a URL dirpath: nothing written, nothing raised
    status = StatusFile(tmp_path / "missing-dir" / STATUS_NAME)
    with caplog.at_level("WARNING", logger="autockpt"):
        status.report("training", 1)
        status.report("checkpointing", 2)
    assert len([r for r in caplog.records if "cannot write the status file" in r.getMessage()]) == 1
    assert not list(tmp_path.glob(".autockpt-tmp-status-*"))


def _session(tmp_path: Path, clock: FakeClock, **config: object) -> CheckpointSession:
    cfg = Config(dirpath=str(tmp_path), overhead_budget=0.02, warmup_steps=3, async_persist=False, **config)  # type: ignore[arg-type]
    return CheckpointSession(cfg, framework="np", suffix=".safetensors", clock=clock)


def test_a_session_keeps_it_current_and_ends_it_finished(tmp_path: Path) -> None:
    clock = FakeClock()
    session = _session(tmp_path, clock)
    state = {"w": np.zeros((10, 10), np.float32)}
    saved = run(session, clock, state, 40)
    during = read_status(tmp_path)
    assert during is not None and during["state"] == "training" and during["run"] == session.run
    assert during["last_durable_step"] == saved[-1][0]
    assert during["emergency_checkpoint_s"] is not None and during["emergency_checkpoint_s"] >= 0.009
    assert during["next_checkpoint_step"] is not None and during["next_checkpoint_step"] > during["step"] - 1
    session.finish()
    after = read_status(tmp_path)
    assert after["state"] == "finished" and after["last_durable_step"] == saved[-1][0]  # type: ignore[index]
    assert json.loads((tmp_path / STATUS_NAME).read_text())["next_checkpoint_step"] is None


def test_a_session_that_fails_ends_it_failed(tmp_path: Path) -> None:
    clock = FakeClock()
    storage = FailingStorage(tmp_path, fail_after=1)
    cfg = Config(dirpath=str(tmp_path), overhead_budget=0.02, warmup_steps=3, async_persist=True)
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors", clock=clock, storage=storage)
    state = {"w": np.zeros((10, 10), np.float32)}
    session.start(0)
    storage.armed = True  # after the directory's probe: the checkpoints' writes fail
    with pytest.raises(CheckpointWriteError):
        for step in range(1, 60):
            clock.t += 0.1
            if session.step_end(step).save:
                session.save(step, 0, make_snapshot(state, clock, 0.01))
                session.writer.wait()
    with contextlib.suppress(CheckpointWriteError):
        session.close()
    assert read_status(tmp_path)["state"] == "failed"  # type: ignore[index]


def test_status_file_false_writes_none(tmp_path: Path) -> None:
    clock = FakeClock()
    session = _session(tmp_path, clock, status_file=False)
    run(session, clock, {"w": np.zeros(3, np.float32)}, 20)
    session.finish()
    assert read_status(tmp_path) is None


def test_a_preemption_records_the_time_from_the_signal_to_its_commit(tmp_path: Path) -> None:
    status = status_file(tmp_path, Clocks())
    status.report("training", 10, next_step=20)
    status.preempted(12, 0.8)
    data = read_status(tmp_path)
    assert data is not None
    assert (data["state"], data["step"], data["signal_to_durable_s"], data["next_checkpoint_step"]) == ("preempted", 12, 0.8, None)
    status.end("failed")  # the session closing after Preempted was raised: it stays preempted
    assert (read_status(tmp_path) or {})["state"] == "preempted"
