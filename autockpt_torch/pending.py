"""The part of a snapshot still being copied when the hook returns ("overlap"/"device" modes).

Threading: created on the training thread by :class:`~autockpt_torch.staging.TorchSnapshotter`;
``before_update`` runs on the training thread before the next optimizer step, ``wait`` on the
session's writer thread before it serializes. The CPU copy runs in its own helper thread
(``autockpt-snapshot-copy``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from .cuda_api import CudaApi
from .host_buffers import host_copy


class PendingCopy:
    """The part of a snapshot still being copied; see :class:`autockpt_core.PendingCopy`.

    Holds a CPU helper thread, CUDA events, or both. ``before_update`` (training thread) joins
    the thread and makes the current CUDA stream wait for ``update_event``; ``wait`` (writer
    thread) joins the thread, re-raises its error, and waits on the host for ``done_event``.
    """

    def __init__(
        self,
        thread_items: Sequence[tuple[torch.Tensor, torch.Tensor]] = (),
        *,
        update_event: Any = None,
        done_event: Any = None,
        device: torch.device | None = None,
        cuda: CudaApi | None = None,
    ) -> None:
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if thread_items:
            self._thread = threading.Thread(
                target=self._copy, args=(list(thread_items),), name="autockpt-snapshot-copy"
            )
            self._thread.start()
        self._update_event = update_event
        self._done_event = done_event
        self._device = device
        self._cuda = cuda

    def _copy(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        try:
            for dst, src in items:
                host_copy(dst, src)
        except BaseException as exc:  # re-raised by wait() in the writer thread
            self._error = exc

    def before_update(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._update_event is not None and self._cuda is not None and self._device is not None:
            self._cuda.current_stream(self._device).wait_event(self._update_event)
            self._update_event = None  # one wait orders every later kernel after the copy

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            if self._error is not None:
                raise RuntimeError("autockpt: the snapshot copy failed") from self._error
        if self._done_event is not None:
            self._done_event.synchronize()
