"""Copy live Keras variables into the session's reusable numpy buffers (phase 1, the stall).

One copier per backend, each avoiding a fresh numpy allocation per variable:

- TensorFlow: one ``tf.function`` reads every variable in a single dispatch; on CPU the
  returned tensors alias the variables' buffers, and ``np.copyto`` copies them into the
  pool's buffers (measured on 2 CPU cores: 12.6 MB in 26 variables 2.1 ms vs 5.6 ms for
  ``v.numpy()`` + copy; 242 small variables 2.7 ms vs 12.4 ms).
  (Checked on TF 2.21: the read returns the variable's own buffer, so the ``np.copyto`` into
  the pool is the only copy and nothing is allocated per checkpoint.)
- torch: on CPU, ``np.copyto(buffer, v.value.detach().numpy())`` (the numpy view aliases the
  tensor; one memcpy in the calling thread). Not ``torch.from_numpy(buffer).copy_(...)``:
  that splits large copies over torch's intra-op threads and waits for all of them, which on
  a busy 2-core machine measured 70-100 ms for 102 MB vs 13-14 ms for ``np.copyto``. CUDA
  tensors: ``non_blocking`` device-to-host copies on a dedicated stream that waits for the
  current one, into pinned buffers (:func:`buffer_pool_for`), then one event wait, so the
  copy is complete when the hook returns. bfloat16 is copied bit-for-bit through an int16
  view.
- JAX: ``fit()`` keeps the state outside the variables and donates its buffers to the next
  step, so the copy syncs the state into the variables (``model.jax_state_sync()``), starts
  every device-to-host transfer (``copy_to_host_async``), then copies each host view into its
  buffer, all before the hook returns (donated buffers are invalid after the next step).
  Written against Keras 3.15's JAX trainer; tested on CPU (no GPU here).
- anything else: ``np.copyto(buffer, v.numpy())`` (one temporary per variable).

Threading: training thread only, between steps (the session calls it inside ``save``); the
TensorFlow copier's one-off preparation (:meth:`TensorFlowCopier.warm`) runs in a helper
thread that its first call waits for. The returned dict maps keys to pool buffers; they
stay valid until the next snapshot, which the session starts only after the previous
persist finished.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autockpt_core import BufferPool

from . import internals
from .jax_state import local_value
from .state import StateEntry

log = logging.getLogger("autockpt")


Copier = Callable[[Sequence[StateEntry], BufferPool[Any]], dict[str, np.ndarray]]
"""Copies ``entries`` into ``pool`` buffers; returns key -> buffer in entry order."""


def copier_for(backend: str, model: Any = None) -> Copier:
    """The cheapest available copier for a Keras backend name (``model``: needed on JAX)."""
    if backend == "tensorflow":
        return TensorFlowCopier()
    if backend == "torch":
        return TorchCopier()
    if backend == "jax":
        return JaxCopier(model)
    return generic_copy


def buffer_pool_for(backend: str) -> BufferPool[Any] | None:
    """Pinned numpy buffers for the torch backend on a CUDA machine; None (plain numpy) else."""
    if backend != "torch":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    from autockpt_torch.host_buffers import numpy_pinned_pool

    return numpy_pinned_pool()


def device_busy_for(backend: str, model: Any) -> Callable[[], bool] | None:
    """The torch backend with the model on a CUDA device: whether that device still has queued
    work (:func:`autockpt_torch.cuda_api.queue_busy_probe`); None for every other case (the
    host's time in a hook is then taken as the training's)."""
    if backend != "torch":
        return None
    import torch

    from autockpt_torch.cuda_api import queue_busy_probe

    for variable in getattr(model, "variables", None) or []:
        value = getattr(variable, "value", None)
        if isinstance(value, torch.Tensor):
            return queue_busy_probe(value.device)
    return None


def host_clock_note(backend: str) -> str | None:
    """Where an accelerator runs the steps but no probe tells whether it still has queued work
    (TensorFlow and JAX on a GPU or TPU): the summary's note that costs are read on the host's
    clock, which may count draining the device's queue as a checkpoint's stall. None elsewhere."""
    if backend == "tensorflow":
        import tensorflow as tf

        kinds = {d.device_type for d in tf.config.list_logical_devices()} - {"CPU"}
    elif backend == "jax":
        import jax

        kinds = {jax.default_backend().upper()} - {"CPU"}
    else:
        return None  # torch: the CUDA probe (device_busy_for); the CPU's clock is the right one
    if not kinds:
        return None
    return (f"costs read on the host's clock: no device probe for {backend} on {'/'.join(sorted(kinds))}, "
            "so a stall may include the device's queued steps")


def generic_copy(entries: Sequence[StateEntry], pool: BufferPool[Any]) -> dict[str, np.ndarray]:
    """Backend-neutral: ``v.numpy()`` then a copy into the pooled buffer."""
    out: dict[str, np.ndarray] = {}
    for entry in entries:
        src = np.asarray(entry.variable.numpy())
        buf = pool.get(entry.key, src.shape, src.dtype)
        np.copyto(buf, src, casting="no")
        out[entry.key] = buf
    return out


class TensorFlowCopier:
    """Batched read of all variables through one cached ``tf.function``.

    The function is rebuilt when the set of variables changes (e.g. the optimizer was built
    after the first snapshot). If it cannot be built or run (e.g. distributed variables), the
    copier falls back to :func:`generic_copy` and logs why, once.
    """

    def __init__(self) -> None:
        self._variables: tuple[Any, ...] = ()
        self._reader: Callable[[], Any] | None = None
        self._fallback = False
        self._warming: threading.Thread | None = None

    def __call__(self, entries: Sequence[StateEntry], pool: BufferPool[Any]) -> dict[str, np.ndarray]:
        self.settle()
        if self._fallback:
            return generic_copy(entries, pool)
        try:
            tensors = self._read(entries)
        except Exception as exc:  # not swallowed: logged, and the generic path is exact too
            log.warning("autockpt: batched TensorFlow read unavailable (%s: %s); copying per variable",
                        type(exc).__name__, exc)
            self._fallback = True
            return generic_copy(entries, pool)
        out: dict[str, np.ndarray] = {}
        for entry, tensor in zip(entries, tensors):
            src = _tf_host_view(tensor)
            buf = pool.get(entry.key, src.shape, src.dtype)
            np.copyto(buf, src, casting="no")
            out[entry.key] = buf
        del tensors  # drop the aliases before training writes the variables again
        return out

    def warm(self, entries: Sequence[StateEntry]) -> None:
        """Build, trace and run the batched read once, discarding what it returns (on CPU it
        aliases the variables: nothing is copied), so the first checkpoint does not pay
        TensorFlow's tracing in its stall.

        Training thread, before the first checkpoint. The work runs in a helper thread while
        training goes on (the trace is Python; a training step releases the interpreter lock
        while TensorFlow computes), so a restart's first step does not wait for it either.
        Under a ``tf.distribute`` strategy, whose scope is the calling thread's, it runs here.
        The helper is not a daemon: an interpreter exit waits for it instead of tearing
        TensorFlow down under it.
        """
        if self._fallback or self._warming is not None:
            return
        import tensorflow as tf

        if tf.distribute.has_strategy():
            self._warm(entries)
            return
        self._warming = threading.Thread(target=self._warm, args=(list(entries),), name="autockpt-tf-read-warm")
        self._warming.start()

    def preparing(self) -> bool:
        """Whether a :meth:`warm` still runs (a copy now would wait for it)."""
        return self._warming is not None and self._warming.is_alive()

    def settle(self) -> None:
        """Wait until a :meth:`warm` still running is done (training thread)."""
        if self._warming is not None:
            self._warming.join()

    def _warm(self, entries: Sequence[StateEntry]) -> None:
        try:
            del self._read(entries)[:]
        except Exception as exc:  # the first checkpoint falls back to the generic copy, logged there
            log.info("autockpt: could not prepare the batched TensorFlow read early: %s", exc)

    def _read(self, entries: Sequence[StateEntry]) -> list[Any]:
        return list(self._reader_for(entries)())

    def _reader_for(self, entries: Sequence[StateEntry]) -> Any:
        import tensorflow as tf

        variables = tuple(e.variable.value for e in entries)
        if self._reader is None or len(variables) != len(self._variables) or any(
            a is not b for a, b in zip(variables, self._variables)
        ):
            captured = list(variables)
            self._reader = tf.function(lambda: [v.read_value() for v in captured], autograph=False)
            self._variables = variables
        return self._reader


def warm_copier(copier: Copier, entries: Sequence[StateEntry]) -> None:
    """Let ``copier`` prepare what its first call would pay for (a no-op for copiers without it)."""
    warm = getattr(copier, "warm", None)
    if warm is not None:
        warm(entries)


def copier_preparing(copier: Copier | None) -> bool:
    """Whether the preparation :func:`warm_copier` started still runs (False for copiers without one)."""
    preparing = getattr(copier, "preparing", None)
    return bool(preparing()) if preparing is not None else False


def settle_copier(copier: Copier) -> float:
    """Wait until a preparation :func:`warm_copier` started is done (training thread); the
    seconds waited (0 for copiers without one)."""
    settle = getattr(copier, "settle", None)
    if settle is None:
        return 0.0
    started = time.perf_counter()
    settle()
    return time.perf_counter() - started


def _tf_host_view(tensor: Any) -> np.ndarray:
    # EagerTensor._numpy() returns a view of a CPU tensor's buffer (no copy); .numpy() copies.
    view = internals.read(tensor, "eager_numpy")
    return np.asarray(view() if view is not None else tensor.numpy())


class TorchCopier:
    """The torch backend's copier: each torch tensor into its numpy buffer without a temporary.

    CPU tensors: ``np.copyto`` from the tensor's numpy alias (one memcpy in this thread).
    CUDA tensors: see :func:`_cuda_to_host` (complete when this returns). ``hidden_s``: of the
    latest call's wait for CUDA copies, the part that was the device finishing queued steps
    (read on the device's clock; the snapshot hands it to the session as ``Snapshot.hidden_s``).
    """

    def __init__(self) -> None:
        self.hidden_s = 0.0

    def __call__(self, entries: Sequence[StateEntry], pool: BufferPool[Any]) -> dict[str, np.ndarray]:
        out, self.hidden_s = _copy_torch(entries, pool)
        return out


def _copy_torch(entries: Sequence[StateEntry], pool: BufferPool[Any]) -> tuple[dict[str, np.ndarray], float]:
    import torch

    out: dict[str, np.ndarray] = {}
    device_items: list[tuple[Any, Any]] = []
    hidden = 0.0
    with torch.no_grad():
        for entry in entries:
            tensor = entry.variable.value.detach()
            dtype = _numpy_dtype_of(tensor.dtype)
            buf = pool.get(entry.key, tuple(tensor.shape), dtype)
            bf16 = tensor.dtype == torch.bfloat16  # numpy has no bfloat16: copy the bits
            if tensor.device.type == "cpu":
                src = tensor.view(torch.int16).numpy() if bf16 else tensor.numpy()
                np.copyto(buf.view(np.int16) if bf16 else buf, src, casting="no")
            elif bf16:
                device_items.append((torch.from_numpy(buf.view(np.int16)), tensor.view(torch.int16)))
            else:
                device_items.append((torch.from_numpy(buf), tensor))
            out[entry.key] = buf
        if device_items:
            hidden = _cuda_to_host(device_items)
    return out, hidden


def _cuda_to_host(items: Sequence[tuple[Any, Any]]) -> float:
    """Device-to-host copies, all enqueued before one wait; returns the part of the host's wait
    since the checkpoint's mark (or since the copies were enqueued) that was the device's queued
    steps (:func:`autockpt_torch.cuda_api.wait_for_copy`; 0 off CUDA).

    On a copy stream that first waits for the current stream (so it sees the finished train
    step), ``non_blocking`` into the (pinned) host buffers between two timing events, then one
    event synchronize. Non-CUDA devices: a plain blocking ``copy_`` each.
    """
    import torch

    from autockpt_torch.cuda_api import take_mark, wait_for_copy

    device = items[0][1].device
    if device.type != "cuda":
        for dst, src in items:
            dst.copy_(src)
        return 0.0
    entry = take_mark(device)  # where the queue ended when the checkpoint began, if marked
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        started = torch.cuda.Event(enable_timing=True)
        started.record(stream)
        for dst, src in items:
            src.record_stream(stream)
            dst.copy_(src, non_blocking=True)
        done = torch.cuda.Event(enable_timing=True)
        done.record(stream)
    return wait_for_copy(started, done, entry)


class JaxCopier:
    """JAX backend (tested on CPU only); see the module docstring.

    ``model`` is the Keras model whose ``fit()`` is running: its ``jax_state_sync()`` puts the
    trainer's current state into the variables first.
    """

    def __init__(self, model: Any) -> None:
        self._model = model

    def __call__(self, entries: Sequence[StateEntry], pool: BufferPool[Any]) -> dict[str, np.ndarray]:
        sync = getattr(self._model, "jax_state_sync", None)
        if callable(sync):
            sync()
        values = [local_value(entry.variable.value) for entry in entries]  # jax.distributed: this process's copy
        for value in values:  # start every transfer before waiting for the first one
            start = getattr(value, "copy_to_host_async", None)
            if callable(start):
                start()
        out: dict[str, np.ndarray] = {}
        for entry, value in zip(entries, values):
            src = np.asarray(value)  # a host view on CPU, the finished transfer on GPU
            buf = pool.get(entry.key, src.shape, src.dtype)
            np.copyto(buf, src, casting="no")
            out[entry.key] = buf
        return out


def _numpy_dtype_of(torch_dtype: Any) -> Any:
    name = str(torch_dtype).rsplit(".", 1)[-1]  # "torch.float32" -> "float32"
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError(f"autockpt cannot snapshot torch dtype {torch_dtype}") from None
