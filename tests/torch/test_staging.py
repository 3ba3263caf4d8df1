"""autockpt_torch/staging.py and pending.py: the snapshot copy in each mode, its consistency rule, and (with a fake CUDA) the
order of stream waits, copies and events. No GPU here: the CUDA path is checked only through
the fake."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import pytest
import torch

from autockpt_torch import TorchSnapshotter, cpu_default_mode, torch_buffer_pool
from autockpt_torch.cuda_api import CudaApi
from autockpt_torch.pending import PendingCopy
from autockpt_torch.staging import optimizer_owned

torch.set_num_threads(1)
MiB = 2**20


def take(snapshotter: TorchSnapshotter, state: Any, pool: Any, deferrable: Any = None) -> tuple[Any, int, Any]:
    pool.begin_round()
    try:
        return snapshotter.snapshot(state, pool, deferrable)
    finally:
        pool.end_round()


# -- mode choice (pure) -----------------------------------------------------------------------


def make_state() -> dict[str, Any]:
    return {
        "state_dict": {"w": torch.randn(64, 32), "bn.running_mean": torch.zeros(32)},
        "optimizer_states": [{"state": {0: {"exp_avg": torch.randn(64, 32), "step": torch.tensor(3.0)}}}],
        "epoch": 1,
    }


def test_cpu_default_overlaps_only_when_training_leaves_a_core() -> None:
    assert cpu_default_mode(threads=2, cores=2) == "sync"
    assert cpu_default_mode(threads=1, cores=2) == "overlap"
    assert cpu_default_mode(threads=1, cores=None) == "sync"
    snapshotter = TorchSnapshotter("auto")  # this module runs torch with 1 thread
    take(snapshotter, make_state(), torch_buffer_pool())
    assert snapshotter.mode == cpu_default_mode(torch.get_num_threads(), os.cpu_count())


def test_sync_copies_everything_before_returning() -> None:
    state = make_state()
    copy, nbytes, pending = take(TorchSnapshotter("sync"), state, torch_buffer_pool(), deferrable=lambda t: True)
    assert pending is None
    assert nbytes == (64 * 32 * 2 + 32 + 1) * 4
    before = state["state_dict"]["w"].clone()
    state["state_dict"]["w"].add_(1)
    assert torch.equal(copy["state_dict"]["w"], before)


def test_overlap_defers_only_optimizer_owned_tensors_and_honours_the_update_rule() -> None:
    state = make_state()
    w, bn = state["state_dict"]["w"], state["state_dict"]["bn.running_mean"]
    deferrable = lambda t: t.data_ptr() in {w.data_ptr(), state["optimizer_states"][0]["state"][0]["exp_avg"].data_ptr()}
    snapshotter = TorchSnapshotter("overlap")
    pool = torch_buffer_pool()
    expected_w, expected_bn = w.clone(), bn.clone()
    copy, _, pending = take(snapshotter, state, pool, deferrable)
    assert snapshotter.mode == "overlap" and isinstance(pending, PendingCopy)
    bn.add_(5)  # the next forward pass: the BN statistic was copied before returning
    pending.before_update()  # the next optimizer step waits for the copy
    w.add_(1)
    pending.wait()  # what the writer thread does
    assert torch.equal(copy["state_dict"]["w"], expected_w)
    assert torch.equal(copy["state_dict"]["bn.running_mean"], expected_bn)
    assert copy["optimizer_states"][0]["state"][0]["step"].item() == 3.0


def test_overlap_without_a_predicate_copies_everything_now() -> None:
    _, _, pending = take(TorchSnapshotter("overlap"), make_state(), torch_buffer_pool())
    assert pending is None


def test_a_failed_helper_copy_is_raised_by_wait() -> None:
    dst, src = torch.empty(3), torch.ones(4)  # shapes differ: numpy refuses
    pending = PendingCopy([(dst, src)])
    pending.before_update()
    with pytest.raises(RuntimeError, match="snapshot copy failed"):
        pending.wait()


@pytest.mark.parametrize(("mode", "rounds"), [("sync", 1000), ("overlap", 50)])
def test_torch_pool_does_not_grow_over_many_checkpoints(mode: str, rounds: int) -> None:
    state = make_state()
    pool = torch_buffer_pool()
    snapshotter = TorchSnapshotter(mode)
    deferrable = optimizer_owned([state["state_dict"]["w"]], [])
    first, _, pending = take(snapshotter, state, pool, deferrable)
    allocations, total = pool.allocations, pool.total_bytes
    for _ in range(rounds):
        if pending is not None:
            pending.before_update()
            pending.wait()
        state["state_dict"]["w"].add_(1)
        copy, _, pending = take(snapshotter, state, pool, deferrable)
    assert (pending is not None) == (mode == "overlap")
    if pending is not None:
        pending.wait()
    assert pool.allocations == allocations and pool.total_bytes == pool.peak_bytes == total
    assert copy["state_dict"]["w"].data_ptr() == first["state_dict"]["w"].data_ptr()
    assert torch.equal(copy["state_dict"]["w"], state["state_dict"]["w"])


def test_optimizer_owned_matches_parameters_and_optimizer_state_only() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    owned = optimizer_owned(model.parameters(), [optimizer])
    sd = model.state_dict()
    assert owned(sd["0.weight"]) and owned(sd["1.bias"])
    assert not owned(sd["1.running_mean"]) and not owned(sd["1.num_batches_tracked"])
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert owned(momentum)


# -- CUDA path through a recording fake -----------------------------------------------------------


class FakeEvent:
    def __init__(self, log: list[str], name: str, at_ms: float = 0.0) -> None:
        self.log, self.name, self.at_ms = log, name, at_ms

    def record(self, stream: FakeStream) -> None:
        self.log.append(f"record {self.name} on {stream.name}")

    def synchronize(self) -> None:
        self.log.append(f"host waits {self.name}")

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.at_ms - self.at_ms


class FakeStream:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(f"{self.name} waits {event.name}")


class FakeCuda(CudaApi):
    def __init__(self, free: int | None = None) -> None:
        self.log: list[str] = []
        self.free = free
        self.current = FakeStream(self.log, "current")
        self.events = 0
        self.timing_events = 0
        self.device_ms: list[float] = []  # the device times of the timing events, in order (default 0)
        self.mark: tuple[FakeEvent, float] | None = None  # a QueueProbe's mark of the checkpoint's start

    def current_stream(self, device: torch.device) -> FakeStream:
        return self.current

    def new_stream(self, device: torch.device) -> FakeStream:
        return FakeStream(self.log, "copy")

    def new_event(self) -> FakeEvent:
        self.events += 1
        return FakeEvent(self.log, f"e{self.events}")

    def new_timing_event(self) -> FakeEvent:  # "now" events share the e<n> numbering with the others
        self.timing_events += 1
        at = self.device_ms[self.timing_events - 1] if self.timing_events <= len(self.device_ms) else 0.0
        if self.timing_events % 2:
            return FakeEvent(self.log, f"t{(self.timing_events + 1) // 2}", at)
        self.events += 1
        return FakeEvent(self.log, f"e{self.events}", at)

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream) -> Any:
        self.log.append(f"enter {stream.name}")
        yield
        self.log.append(f"exit {stream.name}")

    def take_mark(self, device: torch.device) -> tuple[FakeEvent, float] | None:
        mark, self.mark = self.mark, None
        return mark

    def free_bytes(self, device: torch.device) -> int | None:
        return self.free


def gpu_snapshotter(mode: str, cuda: FakeCuda) -> TorchSnapshotter:
    return TorchSnapshotter(mode, cuda=cuda, is_device=lambda t: True)  # CPU tensors pose as GPU ones


def test_cuda_overlap_orders_copies_after_the_step_and_the_next_update_after_the_copy() -> None:
    cuda = FakeCuda()
    state = make_state()
    w = state["state_dict"]["w"]
    snapshotter = gpu_snapshotter("overlap", cuda)
    copy, _, pending = take(snapshotter, state, torch_buffer_pool(pin_memory=False), lambda t: t.data_ptr() == w.data_ptr())
    assert cuda.log == [
        "copy waits for current",  # copies start after the optimizer step's kernels
        "enter copy",
        "record t1 on copy",  # the device's time when the copies start
        "record e1 on copy",  # copies that must finish before the hook returns
        "record e2 on copy",  # ... then the deferred ones
        "exit copy",
        "host waits e1",
    ]
    cuda.log.clear()
    pending.before_update()
    assert cuda.log == ["current waits e2"]  # a stream wait: the host does not block
    pending.before_update()
    assert cuda.log == ["current waits e2"]  # once
    pending.wait()
    assert cuda.log[-1] == "host waits e2"  # the writer thread before torch.save
    assert torch.equal(copy["state_dict"]["w"], w)


def test_cuda_sync_waits_on_the_host_and_returns_nothing_pending() -> None:
    cuda = FakeCuda()
    _, _, pending = take(gpu_snapshotter("sync", cuda), make_state(), torch_buffer_pool(pin_memory=False), lambda t: True)
    assert pending is None
    assert cuda.log == ["copy waits for current", "enter copy", "record t1 on copy", "record e1 on copy", "exit copy",
                        "host waits e1"]  # fmt: skip


def test_cuda_the_wait_for_the_device_s_queued_steps_is_hidden_and_the_copy_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from autockpt_torch import cuda_api, staging

    cuda = FakeCuda()
    cuda.device_ms = [1000.0, 1020.0]  # the copy: 20 ms on the device's clock
    host = iter([5.0, 5.070])  # the host waited 70 ms: 50 ms of queued steps, then the copy
    monkeypatch.setattr(staging, "wait_for_copy", functools.partial(cuda_api.wait_for_copy, clock=lambda: next(host)))
    snapshotter = gpu_snapshotter("sync", cuda)
    take(snapshotter, make_state(), torch_buffer_pool(pin_memory=False), lambda t: True)
    assert snapshotter.hidden_s == pytest.approx(0.050)
    cuda.timing_events, cuda.device_ms = 0, [0.0, 30.0]
    host = iter([7.0, 7.010])  # a wait shorter than the copy's device time (clocks differ): nothing hidden
    take(snapshotter, make_state(), torch_buffer_pool(pin_memory=False), lambda t: True)
    assert snapshotter.hidden_s == 0.0
    # marked when the checkpoint began (host 4.0 s): the host waited 1.07 s in all (the previous
    # persist, then the copy); on the device 300 ms passed from the queue's end to the copy's end
    cuda.timing_events, cuda.device_ms = 0, [9999.0, 300.0]
    cuda.mark = (FakeEvent(cuda.log, "mark", 0.0), 4.0)
    host = iter([5.070])  # read once: after the wait
    take(snapshotter, make_state(), torch_buffer_pool(pin_memory=False), lambda t: True)
    assert snapshotter.hidden_s == pytest.approx(0.770) and cuda.mark is None  # the mark is used once


def test_cuda_device_snapshot_reserves_device_buffers_and_the_update_waits_for_the_device_copy_only() -> None:
    cuda = FakeCuda(free=10 * MiB)
    state = make_state()
    w = state["state_dict"]["w"]
    snapshotter = gpu_snapshotter("auto", cuda)
    pool = torch_buffer_pool(pin_memory=False)
    copy, _, pending = take(snapshotter, state, pool, lambda t: t.data_ptr() == w.data_ptr())
    assert snapshotter.choice is not None and snapshotter.mode == "device", snapshotter.choice
    assert snapshotter.device_buffer_bytes == w.numel() * 4
    assert cuda.log[-4:] == ["record e2 on copy", "record e3 on copy", "exit copy", "host waits e1"]
    assert cuda.log[:3] == ["copy waits for current", "enter copy", "record t1 on copy"]
    cuda.log.clear()
    pending.before_update()
    assert cuda.log == ["current waits e2"]  # device-to-device done; the drain to host goes on
    pending.wait()
    assert cuda.log[-1] == "host waits e3"
    assert torch.equal(copy["state_dict"]["w"], w)
    take(snapshotter, state, pool, lambda t: t.data_ptr() == w.data_ptr())
    assert snapshotter.device_buffer_bytes == w.numel() * 4  # reused, not grown


def test_auto_on_cuda_tries_device_overlap_and_sync_and_frees_the_device_buffers_it_does_not_keep() -> None:
    from autockpt_core.policy.checkpoint_cost import CheckpointCost

    cuda = FakeCuda(free=10 * MiB)
    state = make_state()
    w = state["state_dict"]["w"]
    snapshotter = gpu_snapshotter("auto", cuda)
    pool = torch_buffer_pool(pin_memory=False)
    costs = {"device": 0.05, "overlap": 0.04, "sync": 0.01}  # e.g. a small model: the plain copy wins
    used = []
    while snapshotter.trial is None or snapshotter.trial.trying:
        _, nbytes, pending = take(snapshotter, state, pool, lambda t: t.data_ptr() == w.data_ptr())
        if pending is not None:
            pending.wait()
        used.append(snapshotter.mode)
        snapshotter.record_cost(CheckpointCost(snapshotter.mode or "", costs[snapshotter.mode or ""], 0.0, 1, 0.1, nbytes))
    assert used == ["device", "sync", "overlap"] * 2
    assert snapshotter.choice is not None and snapshotter.choice.mode == "sync"
    assert snapshotter.device_buffer_bytes == 0  # the reserved GPU copy is given back


# -- persist ----------------------------------------------------------------------------------------
