"""The few CUDA calls the snapshot copy makes, behind one class so tests can record them.

The unit tests pass a recording fake of :class:`CudaApi` to check the order of stream waits,
copies and events; ``tests/gpu`` runs the real calls.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any, Callable

import torch


class CudaApi:
    """The few CUDA calls the snapshotter makes; tests pass a recording fake."""

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def new_event(self) -> Any:
        return torch.cuda.Event()

    def new_timing_event(self) -> Any:
        """An event whose time on the device :func:`wait_for_copy` reads."""
        return torch.cuda.Event(enable_timing=True)

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def take_mark(self, device: torch.device) -> tuple[Any, float] | None:
        """:func:`take_mark`: where the device's queue ended when this checkpoint began."""
        return take_mark(device)

    def free_bytes(self, device: torch.device) -> int | None:
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except Exception:  # e.g. a device without the query: "unknown", auto stays on host
            return None


def wait_for_copy(
    started: Any, done: Any, mark: tuple[Any, float] | None = None, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Block the host until the timing event ``done`` has happened; returns the part of the
    host's wait the device's timeline did not lose.

    The wait is counted from ``mark`` (a :meth:`QueueProbe.mark` taken when the checkpoint
    began, :func:`take_mark`: its event on the training's stream and its host time), else from
    this call with ``started`` (a timing event on the copy stream right after it was made to
    wait for the training's stream) as the queue's end. Until the queue's end the device runs
    steps queued before the checkpoint (work it does with or without one); from there to
    ``done`` it is idle or copying: what the training loses. Returns ``max(0, host wait -
    device time from the queue's end to done)``: the queue's drain, hidden from the training
    (the caller subtracts it from the checkpoint's stall).
    """
    end, before = mark if mark is not None else (started, clock())
    done.synchronize()
    waited = clock() - before
    return max(0.0, waited - end.elapsed_time(done) / 1000.0)  # elapsed_time: milliseconds


def record_on_stream(src: torch.Tensor, stream: Any) -> None:
    """Tell the caching allocator ``src`` is in use on ``stream`` (real CUDA tensors only)."""
    if src.is_cuda:
        src.record_stream(stream)


class QueueProbe:
    """A CUDA device's queue, seen from the host (training thread).

    Calling it tells whether the device's current stream still has queued work
    (``cudaStreamQuery``, a few microseconds, no wait): the host runs ahead of the GPU and host
    work done now costs the training nothing. :meth:`mark`, when a checkpoint begins, records
    where the queue ends (a timing event on the current stream) and the host's clock; that
    checkpoint's snapshot copy takes the mark (:func:`take_mark`) and tells, of the host's whole
    wait since the mark, the part the device spent on the queued steps from the part it lost
    (:func:`wait_for_copy`).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = _indexed(device)

    def __call__(self) -> bool:
        return not torch.cuda.current_stream(self.device).query()

    def mark(self) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        _MARKS[self.device] = (event, time.perf_counter())


_MARKS: dict[torch.device, tuple[Any, float]] = {}  # the newest mark per device (training thread)


def take_mark(device: torch.device) -> tuple[Any, float] | None:
    """The newest :meth:`QueueProbe.mark` of ``device`` (its event and host time), removed; None
    when there is none."""
    return _MARKS.pop(_indexed(device), None)


def _indexed(device: torch.device) -> torch.device:
    return device if device.index is not None else torch.device(device.type, torch.cuda.current_device())


def queue_busy_probe(device: torch.device | str | None) -> QueueProbe | None:
    """For a CUDA ``device``: its :class:`QueueProbe` (the driver's ``device_busy``); None for
    any other device."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return QueueProbe(device)
