"""Reusable host buffers for torch snapshots, and the GIL-free host copy into them.

Called from the training thread (allocation, "sync" copies) and from the snapshot-copy helper
thread (:func:`host_copy` in "overlap" mode).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from autockpt_core import BufferPool
from autockpt_core.persist.buffers import fault_in
from autockpt_core.persist.shared_memory import SharedArena, private_fallback

TENSOR_VIEW = "autockpt_torch.host_buffers:tensor_view"


def torch_buffer_pool(pin_memory: bool | None = None) -> BufferPool[torch.Tensor]:
    """A :class:`BufferPool` of CPU torch tensors (pinned when CUDA is available)."""
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory

    def allocate(shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=pin)

    return BufferPool(allocate=allocate, nbytes=tensor_nbytes, touch=touch_tensor)


def torch_shared_pool(arena: SharedArena) -> BufferPool[torch.Tensor]:
    """A :class:`BufferPool` of CPU tensors in shared-memory segments (not pinned), read by
    the persist process (``Config.persist_mode="process"``); ordinary memory once segments
    cannot be had (:func:`~autockpt_core.persist.shared_memory.private_fallback`)."""

    def shared(shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return arena.new_buffer(tensor_view, TENSOR_VIEW, nbytes, dtype, tuple(shape))

    allocate = private_fallback(arena, shared, lambda shape, dtype: torch.empty(shape, dtype=dtype))
    return BufferPool(allocate=allocate, nbytes=tensor_nbytes, release=arena.release, touch=touch_tensor)


def tensor_view(memory: Any, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A CPU tensor of ``dtype`` and ``shape`` at ``offset`` of a mapped segment."""
    count = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
    raw = torch.frombuffer(memory, dtype=torch.uint8, count=count, offset=offset)
    return raw.view(dtype).reshape(shape)


def touch_tensor(tensor: torch.Tensor) -> None:
    """Fault in every page of a CPU buffer (see :func:`~autockpt_core.persist.buffers.fault_in`)."""
    fault_in(tensor.data_ptr(), tensor_nbytes(tensor))


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


def tensor_nbytes(tensor: torch.Tensor) -> int:
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
