"""Snapshot buffers in memory another process can read: anonymous ``memfd`` segments.

The persist process (:mod:`.persist_process`) serializes checkpoints straight from the
training process's snapshot buffers. Each buffer is one segment: an anonymous file from
``os.memfd_create`` (Linux), mapped here and handed to the persist process by file
descriptor over a Unix socket. Nothing has a name in ``/dev/shm``, so nothing leaks when a
process is SIGKILLed: the memory is freed once the last mapping and descriptor are gone.

A buffer is an object the adapter views the segment as (a numpy array, a torch tensor); the
arena remembers which objects are segments (:meth:`SharedArena.ref_of`), so a snapshot tree
can be sent as a small skeleton of :class:`SharedRef` placeholders (:func:`share_tree`) and
rebuilt over the same memory in the other process.

Threading: ``allocate``/``release`` run on the training thread (buffer pool) or the prefault
thread; ``pending_fds``/``ref_of`` on the writer thread; a lock guards the tables.
"""

from __future__ import annotations

import dataclasses
import itertools
import mmap
import os
import socket
import threading
from typing import Any, Callable

import numpy as np

from .buffers import BufferPool, fault_in
from .tree import map_tree

NUMPY_VIEW = "autockpt_core.persist.shared_memory:numpy_view"


def shared_memory_supported() -> bool:
    """True where segments can be made and passed on (``memfd_create`` and ``send_fds``)."""
    return hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


@dataclasses.dataclass(frozen=True)
class SharedRef:
    """Placeholder for one buffer in a shared skeleton: segment id, how to view it, shape."""

    segment: int
    kind: str  # "module:function" building the view in the persist process, see numpy_view
    dtype: Any  # a numpy dtype or a torch dtype (both pickle by reference)
    shape: tuple[int, ...]


@dataclasses.dataclass
class _Segment:
    fd: int
    memory: mmap.mmap
    nbytes: int
    sent: bool = False


class SharedArena:
    """Shared segments of the snapshot buffers; see the module docstring.

    ``allocate(nbytes)`` returns ``(segment id, mmap)``; the caller builds its view and
    registers it with :meth:`register`. ``release(segment)`` closes the descriptor (the
    mapping lives as long as views of it). The persist process learns new segments through
    :meth:`pending_fds` before it is sent a skeleton that uses them.
    """

    def __init__(self) -> None:
        if not shared_memory_supported():
            raise OSError("shared snapshot buffers need os.memfd_create and socket.send_fds (Linux)")
        self._ids = itertools.count(1)
        self._segments: dict[int, _Segment] = {}
        self._refs: dict[int, tuple[Any, SharedRef]] = {}  # id(view) -> (view, ref)
        self._lock = threading.Lock()

    def allocate(self, nbytes: int) -> tuple[int, mmap.mmap]:
        fd = os.memfd_create("autockpt-snapshot", getattr(os, "MFD_CLOEXEC", 1))
        try:
            os.ftruncate(fd, nbytes)
            memory = mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            segment = next(self._ids)
            self._segments[segment] = _Segment(fd, memory, nbytes)
        return segment, memory

    def new_buffer(self, view: Callable[[Any, Any, tuple[int, ...]], Any], view_path: str, nbytes: int,
                   dtype: Any, shape: tuple[int, ...]) -> Any:
        """A fresh segment of ``nbytes`` seen as ``view(memory, dtype, shape)``, registered.

        ``view_path`` names ``view`` ("module:function") for the persist process.
        """
        segment, memory = self.allocate(nbytes)
        buffer = view(memory, dtype, shape)
        self.register(buffer, SharedRef(segment, view_path, dtype, shape))
        return buffer

    def register(self, view: Any, ref: SharedRef) -> None:
        """Remember that ``view`` (the pool's buffer object) is segment ``ref.segment``."""
        with self._lock:
            self._refs[id(view)] = (view, ref)

    def release(self, view: Any) -> None:
        """The pool dropped ``view``: forget it and close its segment's descriptor."""
        with self._lock:
            entry = self._refs.pop(id(view), None)
            segment = self._segments.pop(entry[1].segment, None) if entry is not None else None
        if segment is not None:
            os.close(segment.fd)

    def ref_of(self, value: Any) -> SharedRef | None:
        entry = self._refs.get(id(value))
        return entry[1] if entry is not None and entry[0] is value else None

    def pending_fds(self) -> list[tuple[int, int]]:
        """``(segment, fd)`` of the segments the persist process has not been sent yet; marks them sent."""
        with self._lock:
            fresh = [(sid, seg) for sid, seg in self._segments.items() if not seg.sent]
            for _sid, seg in fresh:
                seg.sent = True
        return [(sid, seg.fd) for sid, seg in fresh]

    def live_segments(self) -> list[int]:
        with self._lock:
            return list(self._segments)

    def resend_all(self) -> None:
        """A new persist process knows no segment: send every one again."""
        with self._lock:
            for seg in self._segments.values():
                seg.sent = False

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(seg.nbytes for seg in self._segments.values())

    def close(self) -> None:
        """Close every descriptor (views keep their mappings until they are dropped)."""
        with self._lock:
            segments, self._segments, self._refs = list(self._segments.values()), {}, {}
        for segment in segments:
            os.close(segment.fd)


def share_tree(tree: Any, arena: SharedArena) -> Any:
    """``tree`` with every arena buffer replaced by its :class:`SharedRef` (other leaves kept)."""
    return map_tree(tree, lambda v: arena.ref_of(v) is not None, lambda _p, v: arena.ref_of(v), other_fn=lambda v: v)


def rebuild_tree(skeleton: Any, view: Callable[[SharedRef], Any]) -> Any:
    """The inverse of :func:`share_tree` in the persist process: ``view(ref)`` for each ref."""
    return map_tree(skeleton, lambda v: isinstance(v, SharedRef), lambda _p, ref: view(ref), other_fn=lambda v: v)


def numpy_shared_pool(arena: SharedArena) -> BufferPool[np.ndarray]:
    """A :class:`BufferPool` of numpy arrays over arena segments (the Keras adapter's buffers)."""

    def allocate(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype=dtype)
        return arena.new_buffer(numpy_view, NUMPY_VIEW, nbytes, dtype, tuple(shape))

    return BufferPool(allocate=allocate, nbytes=lambda a: int(a.nbytes), release=arena.release, touch=touch_array)


def touch_array(array: np.ndarray) -> None:
    """Fault in every page of ``array`` (see :func:`~.buffers.fault_in`)."""
    fault_in(array.ctypes.data, array.nbytes)


def numpy_view(memory: Any, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A numpy array of ``dtype`` and ``shape`` over a mapped segment (persist process side)."""
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(memory, dtype=dtype, count=count).reshape(shape)
