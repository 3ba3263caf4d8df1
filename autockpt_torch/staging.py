"""Where and when the snapshot copy of a torch state runs (phase 1 of a checkpoint).

Modes (``Config.snapshot_mode``):

- ``"sync"``: every tensor is in a host buffer when :meth:`TorchSnapshotter.snapshot`
  returns. CUDA tensors are copied with ``non_blocking=True`` on a dedicated copy stream that
  first waits for the current stream, then one event is waited for.
- ``"overlap"``: tensors only the optimizer step writes (``deferrable``: parameters and
  optimizer state) are copied while the next step's forward and backward run; everything
  else (BatchNorm statistics, RNG states, counters, Python objects) is copied before
  returning. CPU: a helper thread copies through numpy (which releases the GIL). CUDA:
  non-blocking copies on the copy stream, ordered after the optimizer step. CheckFreq's rule
  keeps the snapshot consistent: the *next* optimizer step waits for the copy
  (:meth:`PendingCopy.before_update`: a thread join on CPU; on CUDA the current stream waits
  on the copy's event, the host does not block), and the writer thread waits for it
  (:meth:`PendingCopy.wait`) before serializing.
- ``"device"`` (CUDA only): deferrable tensors are copied device-to-device into reserved GPU
  buffers (event A), then drained to the pinned host buffers on the same stream (event B).
  The next optimizer step waits for A only, the writer for B. Costs one copy of those tensors
  in GPU memory for the whole run.
- ``"auto"``: measured. :func:`auto_candidates` lists the modes that fit the state (CPU:
  "sync" and "overlap"; CUDA: also "device" when it fits in free GPU memory), first guess
  first (:func:`choose_mode`); a :class:`~autockpt_core.policy.mode_trial.ModeTrial` tries
  them on the first checkpoints and keeps the one with the lowest measured cost, fed by the
  session through :meth:`TorchSnapshotter.record_cost`. The choice and its figures are logged.

The overlap modes assume that between two optimizer steps nothing but the optimizer writes
parameters or optimizer state (true for ordinary training; a callback that writes weights
between steps, such as StochasticWeightAveraging's final transfer, needs ``"sync"``).

Threading: ``snapshot`` runs on the training thread; the returned :class:`PendingCopy` is
used by the training thread (``before_update``) and the writer thread (``wait``). Not
tested on a GPU: the CUDA calls go through :class:`CudaApi`, which the unit tests replace
with a recording fake to check the order of stream waits, copies and events.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from autockpt_core import BufferPool
from autockpt_core.persist.tree import map_tree
from autockpt_core.policy.checkpoint_cost import CheckpointCost
from autockpt_core.policy.mode_trial import ModeTrial

from .cuda_api import CudaApi, record_on_stream, wait_for_copy
from .host_buffers import host_copy, tensor_nbytes
from .modes import MODES, ModeChoice, auto_candidates, choose_mode, cpu_default_mode
from .pending import PendingCopy

__all__ = ["DeferPredicate", "TorchSnapshotter", "optimizer_owned"]

log = logging.getLogger("autockpt")

DeferPredicate = Callable[[torch.Tensor], bool]


class TorchSnapshotter:
    """Copies torch state trees into a :class:`BufferPool` in one of the modes above.

    Call order (training thread): ``snapshot(state, pool, deferrable)`` inside the session's
    snapshot callable, bracketed by ``pool.begin_round()``/``end_round()`` (the session does
    it); then the session calls ``before_update()`` on the returned :class:`PendingCopy`
    before the next optimizer step, and ``wait()`` in the writer thread. A requested mode is
    kept; "auto" measures (``trial``): pass ``record_cost`` to the session as its
    ``on_checkpoint_cost`` (training thread). ``choice`` is the mode in use and why; ``mode``
    the mode of the latest snapshot. ``threads``: torch's intra-op thread count
    while copying on the training thread (see :func:`autockpt_torch.snapshot_tree`).
    ``cpu_auto``: the CPU choice of ``"auto"`` (default: :func:`cpu_default_mode` of torch's
    thread count and the cores, at the first snapshot). ``cuda`` and ``is_device`` exist for
    tests (a fake CUDA and CPU tensors posing as GPU ones).
    """

    def __init__(
        self,
        mode: str = "auto",
        *,
        threads: int | None = 1,
        cpu_auto: str | None = None,
        cuda: CudaApi | None = None,
        is_device: DeferPredicate | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown snapshot mode {mode!r}; use one of {', '.join(MODES)}")
        self.requested = mode
        self.threads = threads
        self.cpu_auto = cpu_auto
        self.choice: ModeChoice | None = ModeChoice("sync", "requested") if mode == "sync" else None
        self.trial: ModeTrial | None = None
        self._last_mode: str | None = None
        self._cuda = cuda if cuda is not None else CudaApi()
        self._is_device = is_device if is_device is not None else (lambda t: bool(t.is_cuda))
        self._streams: dict[Any, Any] = {}
        self._device_pool: BufferPool[torch.Tensor] | None = None
        self.hidden_s = 0.0

    @property
    def mode(self) -> str | None:
        """The copy mode of the latest snapshot (None before the first)."""
        return self._last_mode

    def record_cost(self, cost: CheckpointCost) -> None:
        """A checkpoint's measured cost (the session's ``on_checkpoint_cost``; training thread).

        Feeds the "auto" trial; logs a choice or a re-trial. A no-op for a requested mode.
        """
        trial = self.trial
        if trial is None:
            return
        message = trial.record(cost)
        if message is None:
            return
        log.info("autockpt: %s", message)
        self.choice = ModeChoice(trial.next_mode(), trial.reason)
        if not trial.trying and trial.chosen != "device":
            self._device_pool = None  # reserved GPU buffers of a mode not kept (its copies are done)

    @property
    def device_buffer_bytes(self) -> int:
        """GPU memory held by the ``"device"`` mode's reserved buffers."""
        return self._device_pool.total_bytes if self._device_pool is not None else 0

    def snapshot(
        self, state: Any, pool: BufferPool[torch.Tensor], deferrable: DeferPredicate | None = None
    ) -> tuple[Any, int, PendingCopy | None]:
        """Copy ``state`` into ``pool``; returns ``(copy, nbytes, pending)``.

        ``copy`` has the structure of ``state`` with tensors replaced by pool buffers (sparse,
        quantized and other layouts: a fresh CPU copy) and other leaves deep-copied.
        ``pending`` is None when every byte is copied; otherwise the caller must honour it
        (``CheckpointSession`` does). Without ``deferrable`` nothing is deferred.
        """
        if self.choice is None:
            self.choice = self._choose(state, deferrable)
            log.info("autockpt: snapshot copy mode %s (%s)", self.choice.mode, self.choice.reason)
        mode = self.trial.next_mode() if self.trial is not None else self.choice.mode
        self._last_mode = mode
        self.hidden_s = 0.0
        defer = deferrable if (deferrable is not None and mode != "sync") else None
        now_items: list[tuple[torch.Tensor, torch.Tensor]] = []  # copied before returning
        later_items: list[tuple[Hashable, torch.Tensor, torch.Tensor]] = []  # overlapping the next step
        total = 0
        seen: set[Hashable] = set()

        def place(path: str, tensor: torch.Tensor) -> torch.Tensor:
            nonlocal total
            src = tensor.detach()
            total += tensor_nbytes(src)
            if src.layout != torch.strided or src.is_quantized:
                return src.to("cpu", copy=True)
            key: Hashable = path
            while key in seen:
                key = (key, "dup")
            seen.add(key)
            buffer = pool.get(key, tuple(src.shape), src.dtype)
            if defer is not None and defer(src):
                later_items.append((key, buffer, src))
            else:
                now_items.append((buffer, src))
            return buffer

        with _torch_threads(self.threads):
            copied = map_tree(state, _is_tensor, place)
            pending = self._copy(mode, now_items, later_items)
        return copied, total, pending

    # -- internals ------------------------------------------------------------------------

    def _choose(self, state: Any, deferrable: DeferPredicate | None) -> ModeChoice:
        device: torch.device | None = None
        deferred_bytes = 0

        def scan(path: str, tensor: torch.Tensor) -> torch.Tensor:
            nonlocal device, deferred_bytes
            if self._is_device(tensor):
                device = device or tensor.device
                if deferrable is None or deferrable(tensor):
                    deferred_bytes += tensor_nbytes(tensor)
            return tensor

        map_tree(state, _is_tensor, scan, other_fn=lambda x: x)
        free = self._cuda.free_bytes(device) if device is not None else None
        cpu_auto = self.cpu_auto or cpu_default_mode(torch.get_num_threads(), os.cpu_count())
        guess = choose_mode(
            self.requested,
            on_cuda=device is not None,
            deferrable_bytes=deferred_bytes,
            free_device_bytes=free,
            cpu_auto=cpu_auto,
        )
        if self.requested != "auto":
            return guess
        self.trial = ModeTrial(auto_candidates(guess.mode, on_cuda=device is not None))
        return ModeChoice(self.trial.next_mode(), f"auto: {self.trial.reason} on the next checkpoints, first guess {guess.reason}")

    def _stream(self, device: torch.device) -> Any:
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = self._cuda.new_stream(device)
        return stream

    def _copy(
        self,
        mode: str,
        now_items: list[tuple[torch.Tensor, torch.Tensor]],
        later_items: list[tuple[Hashable, torch.Tensor, torch.Tensor]],
    ) -> PendingCopy | None:
        gpu_now = [(d, s) for d, s in now_items if self._is_device(s)]
        cpu_now = [(d, s) for d, s in now_items if not self._is_device(s)]
        gpu_later = [(k, d, s) for k, d, s in later_items if self._is_device(s)]
        cpu_later = [(d, s) for _k, d, s in later_items if not self._is_device(s)]
        for dst, src in cpu_now:
            host_copy(dst, src)
        update_event = done_event = device = None
        if gpu_now or gpu_later:
            device = (gpu_now[0][1] if gpu_now else gpu_later[0][2]).device
            update_event, done_event = self._copy_gpu(device, mode, gpu_now, gpu_later)
        if not (cpu_later or update_event is not None or done_event is not None):
            return None
        return PendingCopy(cpu_later, update_event=update_event, done_event=done_event, device=device, cuda=self._cuda)

    def _copy_gpu(
        self,
        device: torch.device,
        mode: str,
        now: list[tuple[torch.Tensor, torch.Tensor]],
        later: list[tuple[Hashable, torch.Tensor, torch.Tensor]],
    ) -> tuple[Any, Any]:
        """Enqueue the device copies on the copy stream; returns (update_event, done_event).

        Order on the copy stream: wait for the current stream (the optimizer step that just
        ran), timing event ``started``, the copies that must finish before returning, timing
        event ``now`` (waited for here on the host, :attr:`hidden_s` measured from the
        checkpoint's mark where the driver made one, else from ``started``), then the
        deferred copies (device mode: device-to-device, event ``update``, then device-to-host)
        and event ``done``.
        """
        cuda = self._cuda
        entry = cuda.take_mark(device)  # where the queue ended when the checkpoint began, if marked
        stream = self._stream(device)
        stream.wait_stream(cuda.current_stream(device))
        update_event = done_event = None
        with cuda.use_stream(stream):
            started = cuda.new_timing_event()
            started.record(stream)
            for dst, src in now:
                record_on_stream(src, stream)
                dst.copy_(src, non_blocking=True)
            now_event = cuda.new_timing_event()
            now_event.record(stream)
            if later:
                if mode == "device":
                    pool = self._device_buffers(device)
                    pool.begin_round()
                    staged = []
                    for key, dst, src in later:
                        reserved = pool.get(key, tuple(src.shape), src.dtype)
                        reserved.copy_(src, non_blocking=True)
                        staged.append((dst, reserved))
                    pool.end_round()
                    update_event = cuda.new_event()
                    update_event.record(stream)
                    for dst, reserved in staged:
                        dst.copy_(reserved, non_blocking=True)
                else:
                    for _key, dst, src in later:
                        record_on_stream(src, stream)
                        dst.copy_(src, non_blocking=True)
                done_event = cuda.new_event()
                done_event.record(stream)
                if update_event is None:
                    update_event = done_event
        self.hidden_s = wait_for_copy(started, now_event, entry)
        return update_event, done_event

    def _device_buffers(self, device: torch.device) -> BufferPool[torch.Tensor]:
        if self._device_pool is None:

            def allocate(shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
                return torch.empty(shape, dtype=dtype, device=device)

            self._device_pool = BufferPool(allocate=allocate, nbytes=tensor_nbytes)
        return self._device_pool


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Any:
    previous = torch.get_num_threads()
    switch = threads is not None and threads != previous
    if switch:
        torch.set_num_threads(threads)  # type: ignore[arg-type]
    try:
        yield
    finally:
        if switch:
            torch.set_num_threads(previous)


def optimizer_owned(parameters: Any, optimizers: Sequence[Any]) -> DeferPredicate:
    """A ``deferrable`` predicate: True for tensors whose memory is a parameter or an optimizer
    state tensor (matched by data pointer and size, so ``param.detach()`` views in a
    state_dict count). Build it at each checkpoint: optimizers create state lazily."""
    owned: set[tuple[int, int]] = set()
    for p in parameters:
        if p.numel():
            owned.add((p.data_ptr(), p.numel()))
    for optimizer in optimizers:
        for per_param in getattr(optimizer, "state", {}).values():
            for value in per_param.values() if isinstance(per_param, dict) else ():
                if isinstance(value, torch.Tensor) and value.numel():
                    owned.add((value.data_ptr(), value.numel()))
    return lambda t: (t.data_ptr(), t.numel()) in owned
