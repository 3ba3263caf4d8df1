"""The few CUDA calls the snapshot copy makes, behind one class so tests can record them.

The unit tests pass a recording fake of :class:`CudaApi` to check the order of stream waits,
copies and events; ``tests/gpu`` runs the real calls.
"""

from __future__ import annotations

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

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def free_bytes(self, device: torch.device) -> int | None:
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except Exception:  # e.g. a device without the query: "unknown", auto stays on host
            return None


def record_on_stream(src: torch.Tensor, stream: Any) -> None:
    """Tell the caching allocator ``src`` is in use on ``stream`` (real CUDA tensors only)."""
    if src.is_cuda:
        src.record_stream(stream)


def queue_busy_probe(device: torch.device | str | None) -> Callable[[], bool] | None:
    """For a CUDA ``device``: a function telling whether its current stream still has queued
    work (``cudaStreamQuery``, a few microseconds, no wait), i.e. the host runs ahead of the GPU
    and host work done now costs the training nothing. None for any other device."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None

    def busy() -> bool:
        return not torch.cuda.current_stream(device).query()

    return busy
