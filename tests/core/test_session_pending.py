"""The session with a snapshot copy still pending (the writer and the next step wait for it, the
wait counts as stall), and buffers that stay bounded over 1,000 checkpoints."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from autockpt_core import CheckpointSession, Config, Snapshot, read_tensor_file
from autockpt_core.persist.tensorfile import write_tensor_file


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakePending:
    """Records the order of before_update/wait relative to the file write."""

    def __init__(self, log: list[str], clock: FakeClock, wait_s: float) -> None:
        self.log, self.clock, self.wait_s = log, clock, wait_s

    def before_update(self) -> None:
        self.log.append("before_update")
        self.clock.t += self.wait_s

    def wait(self) -> None:
        self.log.append("wait")


def test_pending_copy_orders_the_writer_and_counts_the_wait_as_stall(tmp_path) -> None:
    clock = FakeClock()
    log: list[str] = []
    cfg = Config(dirpath=str(tmp_path), every_n_steps=2, async_persist=False, warmup_steps=0)
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors", clock=clock)
    state = {"w": np.arange(6, dtype=np.float32)}

    def snapshot(pool: Any) -> Snapshot:
        buf = pool.get("w", (6,), np.float32)
        np.copyto(buf, state["w"])
        clock.t += 0.01

        def write(f: Any) -> int:
            log.append("write")
            return write_tensor_file(f, {"w": buf})

        return Snapshot(write=write, nbytes=24, pending=FakePending(log, clock, 0.03), mode="overlap")

    session.start(0)
    clock.t += 0.1
    assert session.step_end(1).save is False
    assert session.before_update() == 0.0  # nothing pending
    clock.t += 0.1
    assert session.step_end(2).save
    stall = session.save(2, 0, snapshot)
    assert log == ["wait", "write"]  # the writer waited for the copy before serializing
    assert stall == pytest.approx(0.01)
    assert session.estimates().stall_s is None  # recorded once the copy is waited for
    assert session.before_update() == pytest.approx(0.03)
    assert log == ["wait", "write", "before_update"]
    assert session.estimates().stall_s == pytest.approx(0.04)
    assert session.before_update() == 0.0  # only once
    summary = session.finish()
    assert summary.copy_mode == "overlap" and summary.buffer_peak_bytes == 24
    assert "(overlap copy)" in summary.line() and "host buffers 24B" in summary.line()
    metrics = session.metrics()
    assert metrics["autockpt/buffer_bytes"] == 24 and metrics["autockpt/buffer_peak_bytes"] == 24


def test_finish_waits_for_a_copy_still_pending(tmp_path) -> None:
    clock = FakeClock()
    log: list[str] = []
    session = CheckpointSession(Config(dirpath=str(tmp_path)), framework="np", suffix=".st", clock=clock)
    session.start(0)
    session.save(1, 0, lambda pool: Snapshot(write=lambda f: f.write(b"x"), nbytes=1, pending=FakePending(log, clock, 0.0)))
    session.finish()
    assert "before_update" in log and "wait" in log


def test_buffers_do_not_grow_over_1000_checkpoints() -> None:
    cfg = Config(dirpath="memory://autockpt-fast-snapshot-1000", every_n_steps=1, keep_last=1, async_persist=False)
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors")
    state = {"a": np.ones((32, 8), np.float32), "b": np.arange(5, dtype=np.int64)}

    def snapshot(pool: Any) -> Snapshot:
        arrays = {}
        for key, value in state.items():
            arrays[key] = pool.get(key, value.shape, value.dtype)
            np.copyto(arrays[key], value)
        return Snapshot(write=lambda f: write_tensor_file(f, arrays), nbytes=sum(a.nbytes for a in arrays.values()))

    session.start(0)
    for step in range(1, 1001):
        state["a"] += 1
        session.save(step, 0, snapshot)
    nbytes = sum(v.nbytes for v in state.values())
    assert session.buffers.allocations == 2
    assert session.buffers.total_bytes == session.buffers.peak_bytes == nbytes
    records = session.records()
    assert [r.step for r in records] == [1000]
    with session.storage.open_read(records[0].name) as f:
        arrays, _ = read_tensor_file(f.read())
    assert arrays["a"][0, 0] == 1001
    session.finish()
