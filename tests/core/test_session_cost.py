"""The session measures each checkpoint's cost for ``on_checkpoint_cost``: the hook's stall, the
wait before the next update, and the excess of the steps that overlapped the copy or the persist
(a fake clock; a real writer thread held by an event)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from autockpt_core import CheckpointSession, Config, Snapshot
from autockpt_core.persist.tensorfile import write_tensor_file
from autockpt_core.policy.checkpoint_cost import CheckpointCost, excess_noise
from tests.core.test_session_pending import FakeClock


class WaitingCopy:
    """A pending copy whose before_update takes ``wait_s`` of fake time."""

    def __init__(self, clock: FakeClock, wait_s: float) -> None:
        self.clock, self.wait_s = clock, wait_s

    def before_update(self) -> None:
        self.clock.t += self.wait_s

    def wait(self) -> None:
        pass


def make_session(tmp_path: Any, clock: FakeClock, costs: list[CheckpointCost], async_persist: bool) -> CheckpointSession:
    cfg = Config(dirpath=str(tmp_path), every_n_steps=1000, async_persist=async_persist, warmup_steps=0,
                 persist_mode="thread")
    return CheckpointSession(cfg, framework="np", suffix=".safetensors", clock=clock, on_checkpoint_cost=costs.append)


def snapshot_fn(clock: FakeClock, stall_s: float, mode: str | None, pending: Any = None,
                gate: threading.Event | None = None) -> Any:
    def snapshot(pool: Any) -> Snapshot:
        buf = pool.get("w", (4,), np.float32)
        buf[:] = 1.0
        clock.t += stall_s

        def write(f: Any) -> int:
            if gate is not None:
                assert gate.wait(10)
            return write_tensor_file(f, {"w": buf})

        return Snapshot(write=write, nbytes=16, pending=pending, mode=mode)

    return snapshot


def clean_steps(session: CheckpointSession, clock: FakeClock, first: int, n: int, seconds: float = 0.1) -> int:
    for step in range(first, first + n):
        clock.t += seconds
        session.step_end(step)
    return first + n


def test_an_overlapped_copy_costs_its_stall_its_wait_and_the_slower_step(tmp_path) -> None:
    clock, costs = FakeClock(), []
    session = make_session(tmp_path, clock, costs, async_persist=False)
    session.start(0)
    step = clean_steps(session, clock, 1, 5)
    session.save(step - 1, 0, snapshot_fn(clock, 0.01, "overlap", WaitingCopy(clock, 0.03)))
    clock.t += 0.12  # the next step's forward/backward, slowed by the copy
    assert session.before_update() == pytest.approx(0.03)
    assert costs == []
    session.step_end(step)
    [cost] = costs
    assert cost.mode == "overlap" and cost.nbytes == 16 and cost.steps == 1
    assert cost.stall_s == pytest.approx(0.04) and cost.excess_s == pytest.approx(0.02)
    assert cost.iter_time_s == pytest.approx(0.1)
    session.finish()


def test_a_background_persist_is_charged_for_every_step_it_overlaps(tmp_path) -> None:
    clock, costs = FakeClock(), []
    session = make_session(tmp_path, clock, costs, async_persist=True)
    session.start(0)
    step = clean_steps(session, clock, 1, 5)
    gate = threading.Event()
    session.save(step - 1, 0, snapshot_fn(clock, 0.05, "sync", gate=gate))
    step = clean_steps(session, clock, step, 3, seconds=0.11)  # the persist is still writing
    assert costs == []
    gate.set()
    session.flush()  # committed
    clean_steps(session, clock, step, 1, seconds=0.1)  # the step that sees the writer idle closes it
    [cost] = costs
    assert cost.mode == "sync" and cost.steps == 4
    assert cost.stall_s == pytest.approx(0.05) and cost.excess_s == pytest.approx(0.03)
    assert cost.excess_sd_s == pytest.approx(0.0, abs=1e-12)  # identical clean steps: no noise
    session.finish()


def test_the_cost_carries_the_noise_of_the_clean_steps(tmp_path) -> None:
    clock, costs = FakeClock(), []
    session = make_session(tmp_path, clock, costs, async_persist=False)
    session.start(0)
    step = 1
    for seconds in [0.09, 0.11] * 5:  # ±10 ms
        step = clean_steps(session, clock, step, 1, seconds=seconds)
    session.save(step - 1, 0, snapshot_fn(clock, 0.01, "sync"))
    clean_steps(session, clock, step, 1)
    [cost] = costs
    assert cost.steps == 1 and cost.excess_sd_s == pytest.approx(excess_noise(1.4826 * 0.01, 1))
    session.finish()


def test_a_checkpoint_right_after_another_closes_the_first_ones_cost(tmp_path) -> None:
    clock, costs = FakeClock(), []
    session = make_session(tmp_path, clock, costs, async_persist=True)
    session.start(0)
    step = clean_steps(session, clock, 1, 5)
    session.save(step - 1, 0, snapshot_fn(clock, 0.02, "sync"))
    session.save(step, 0, snapshot_fn(clock, 0.02, "overlap"))  # before any step_end
    assert [c.mode for c in costs] == ["sync"]
    session.finish()


def test_no_cost_without_a_mode_or_before_the_iteration_time_is_known(tmp_path) -> None:
    clock, costs = FakeClock(), []
    session = make_session(tmp_path, clock, costs, async_persist=False)
    session.start(0)
    session.save(0, 0, snapshot_fn(clock, 0.02, "sync"))  # no clean iteration measured yet
    step = clean_steps(session, clock, 1, 5)
    session.save(step - 1, 0, snapshot_fn(clock, 0.02, None))  # an adapter without copy modes (Keras)
    clean_steps(session, clock, step, 2)
    assert costs == []
    session.finish()
