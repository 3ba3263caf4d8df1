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
- ``"auto"``: :func:`choose_mode` on the first snapshot, from the state's devices, its size,
  free GPU memory and, on CPU, :func:`cpu_default_mode` (measured with ``autockpt bench``);
  the choice is logged.

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
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

from autockpt_core import BufferPool
from autockpt_core.persist.tree import map_tree

__all__ = [
    "CudaApi",
    "ModeChoice",
    "TorchSnapshotter",
    "choose_mode",
    "cpu_default_mode",
    "numpy_pinned_pool",
    "optimizer_owned",
    "torch_buffer_pool",
]

log = logging.getLogger("autockpt")

def cpu_default_mode(threads: int, cores: int | None) -> str:
    """What ``"auto"`` picks on CPU: ``"overlap"`` when training leaves a core for the copy
    thread (torch's intra-op ``threads`` < ``cores``), else ``"sync"``.

    Measured with ``autockpt bench`` on the project's shared 2-core machines
    (docs/benchmarks.md): with 1 training thread, overlapping halved the blocked time at
    100 MB (16.9 vs 36.1 ms) at equal training slowdown; with 2 training threads the helper
    thread competed with them and steps got slower (median of 3 pairs: 501 vs 340 ms).
    """
    return "overlap" if cores is not None and threads < cores else "sync"

DEVICE_FRACTION = 0.5
"""``"auto"`` reserves GPU buffers only when they take at most this share of free GPU memory."""

MODES = ("auto", "sync", "overlap", "device")


@dataclasses.dataclass(frozen=True)
class ModeChoice:
    """The copy mode in use and why it was chosen (logged once)."""

    mode: str
    reason: str


def choose_mode(
    requested: str,
    *,
    on_cuda: bool,
    deferrable_bytes: int,
    free_device_bytes: int | None,
    cpu_auto: str = "sync",
    device_fraction: float = DEVICE_FRACTION,
) -> ModeChoice:
    """The mode to use for a state (pure; see the module docstring for the modes).

    ``on_cuda``: some tensor of the state lives on a CUDA device. ``deferrable_bytes``: the
    bytes a GPU-side snapshot would reserve. ``free_device_bytes``: free memory of that
    device (None if unknown). ``cpu_auto``: the CPU choice (see :func:`cpu_default_mode`).
    """
    if requested not in MODES:
        raise ValueError(f"unknown snapshot mode {requested!r}; use one of {', '.join(MODES)}")
    if requested == "sync":
        return ModeChoice("sync", "requested")
    fits = free_device_bytes is not None and deferrable_bytes <= device_fraction * free_device_bytes
    room = (
        f"{deferrable_bytes / 2**20:.0f} MiB of {free_device_bytes / 2**20:.0f} MiB free"
        if free_device_bytes is not None
        else "free GPU memory unknown"
    )
    if requested == "overlap":
        return ModeChoice("overlap", "requested")
    if requested == "device":
        if not on_cuda:
            return ModeChoice("overlap", "device snapshot requested, but no tensor is on a GPU")
        if free_device_bytes is not None and deferrable_bytes > free_device_bytes:
            return ModeChoice("overlap", f"device snapshot requested, but it does not fit ({room})")
        return ModeChoice("device", "requested")
    if not on_cuda:  # auto, CPU
        return ModeChoice(cpu_auto, "auto: CPU state (cpu_default_mode, docs/benchmarks.md)")
    if fits:
        return ModeChoice("device", f"auto: GPU-side snapshot fits ({room})")
    return ModeChoice("overlap", f"auto: GPU-side snapshot too large ({room}); copying to host on a stream")


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


def torch_buffer_pool(pin_memory: bool | None = None) -> BufferPool[torch.Tensor]:
    """A :class:`BufferPool` of CPU torch tensors (pinned when CUDA is available)."""
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory

    def allocate(shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=pin)

    return BufferPool(allocate=allocate, nbytes=_tensor_nbytes)


def numpy_pinned_pool() -> BufferPool[np.ndarray]:
    """A :class:`BufferPool` of numpy arrays in pinned (page-locked) host memory.

    For numpy-based snapshots of CUDA tensors (Keras on the torch backend): device-to-host
    copies into pinned memory run at full bus speed and can be asynchronous. Each array keeps
    its torch allocation alive (``Tensor.numpy()`` sets the tensor as the array's base).
    """

    def allocate(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        raw = torch.empty(count * dtype.itemsize, dtype=torch.uint8, pin_memory=True)
        return raw.numpy().view(dtype).reshape(shape)

    return BufferPool(allocate=allocate, nbytes=lambda a: int(a.nbytes))


def _tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def host_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy CPU ``src`` into the CPU buffer ``dst`` (same shape and dtype) in this thread.

    Contiguous tensors are copied as bytes through numpy, which releases the GIL and uses one
    thread, so a helper thread can run it next to training (torch's ``copy_`` would split a
    large copy over the intra-op threads the training step uses). Others use ``copy_``.
    """
    if dst.numel() == 0:
        return
    if src.is_contiguous() and not (src.is_conj() or src.is_neg()):
        out = dst.reshape(-1).view(torch.uint8).numpy()
        np.copyto(out, src.reshape(-1).view(torch.uint8).numpy())
    else:
        dst.copy_(src)


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
                target=self._copy, args=(list(thread_items),), name="autockpt-snapshot-copy", daemon=True
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


DeferPredicate = Callable[[torch.Tensor], bool]


class TorchSnapshotter:
    """Copies torch state trees into a :class:`BufferPool` in one of the modes above.

    Call order (training thread): ``snapshot(state, pool, deferrable)`` inside the session's
    snapshot callable, bracketed by ``pool.begin_round()``/``end_round()`` (the session does
    it); then the session calls ``before_update()`` on the returned :class:`PendingCopy`
    before the next optimizer step, and ``wait()`` in the writer thread. The mode is chosen
    on the first call and kept (``choice``). ``threads``: torch's intra-op thread count
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
        self._cuda = cuda if cuda is not None else CudaApi()
        self._is_device = is_device if is_device is not None else (lambda t: bool(t.is_cuda))
        self._streams: dict[Any, Any] = {}
        self._device_pool: BufferPool[torch.Tensor] | None = None

    @property
    def mode(self) -> str | None:
        return self.choice.mode if self.choice is not None else None

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
        mode = self.choice.mode
        defer = deferrable if (deferrable is not None and mode != "sync") else None
        now_items: list[tuple[torch.Tensor, torch.Tensor]] = []  # copied before returning
        later_items: list[tuple[Hashable, torch.Tensor, torch.Tensor]] = []  # overlapping the next step
        total = 0
        seen: set[Hashable] = set()

        def place(path: str, tensor: torch.Tensor) -> torch.Tensor:
            nonlocal total
            src = tensor.detach()
            total += _tensor_nbytes(src)
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
                    deferred_bytes += _tensor_nbytes(tensor)
            return tensor

        map_tree(state, _is_tensor, scan, other_fn=lambda x: x)
        free = self._cuda.free_bytes(device) if device is not None else None
        cpu_auto = self.cpu_auto or cpu_default_mode(torch.get_num_threads(), os.cpu_count())
        return choose_mode(
            self.requested,
            on_cuda=device is not None,
            deferrable_bytes=deferred_bytes,
            free_device_bytes=free,
            cpu_auto=cpu_auto,
        )

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
        ran), the copies that must finish before returning, event ``now`` (waited for here on
        the host), then the deferred copies (device mode: device-to-device, event ``update``,
        then device-to-host) and event ``done``.
        """
        cuda = self._cuda
        stream = self._stream(device)
        stream.wait_stream(cuda.current_stream(device))
        update_event = done_event = None
        with cuda.use_stream(stream):
            for dst, src in now:
                _record(src, stream)
                dst.copy_(src, non_blocking=True)
            now_event = cuda.new_event()
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
                        _record(src, stream)
                        dst.copy_(src, non_blocking=True)
                done_event = cuda.new_event()
                done_event.record(stream)
                if update_event is None:
                    update_event = done_event
        now_event.synchronize()
        return update_event, done_event

    def _device_buffers(self, device: torch.device) -> BufferPool[torch.Tensor]:
        if self._device_pool is None:

            def allocate(shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
                return torch.empty(shape, dtype=dtype, device=device)

            self._device_pool = BufferPool(allocate=allocate, nbytes=_tensor_nbytes)
        return self._device_pool


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _record(src: torch.Tensor, stream: Any) -> None:
    """Tell the caching allocator ``src`` is in use on ``stream`` (real CUDA tensors only)."""
    if src.is_cuda:
        src.record_stream(stream)


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
