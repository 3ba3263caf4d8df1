"""Snapshot buffers in memory another process can read: a few large anonymous segments.

The persist process (:mod:`.persist_process`) serializes checkpoints straight from the
training process's snapshot buffers. The buffers are carved out of a few large segments:
anonymous files from ``os.memfd_create`` (Linux), mapped here and handed to the persist
process by file descriptor over a Unix socket. Each buffer is a range of a segment at a
64-byte aligned offset, so the number of open descriptors does not grow with the number of
tensors: a segment is at least :data:`SEGMENT_BYTES` and at least as large as all segments
before it together, so a state of S bytes needs about log2(S / 64 MiB) + 2 segments.
Segments are sparse: only the pages a buffer touches use memory. Nothing has a name in
``/dev/shm``, so nothing leaks when a process is SIGKILLed: the memory is freed once the last
mapping and descriptor are gone.

A buffer is an object the adapter views its range as (a numpy array, a torch tensor); the
arena remembers which objects are buffers (:meth:`SharedArena.ref_of`) and which segment
holds an address (:meth:`SharedArena.locate`), so a write can be sent as a small skeleton of
:class:`SharedRef` placeholders and rebuilt over the same memory in the other process.

When segments cannot be had (no descriptors or memory left), :func:`private_fallback` makes
the pool allocate ordinary memory instead, with one warning; checkpoints whose buffers are
not shared are written by the writer thread.

Threading: ``new_buffer``/``release`` run on the training thread (buffer pool) or the
prefault thread; ``pending_fds``/``ref_of``/``locate`` on the writer thread; a lock guards
the tables.
"""

from __future__ import annotations

import bisect
import ctypes
import dataclasses
import itertools
import logging
import mmap
import os
import socket
import threading
import weakref
from typing import Any, Callable, TypeVar

import numpy as np

from .buffers import BufferPool, fault_in
from .tree import map_tree

log = logging.getLogger("autockpt")

NUMPY_VIEW = "autockpt_core.persist.shared_memory:numpy_view"
SEGMENT_BYTES = 64 << 20
"""The smallest segment (virtual size; pages are used only once a buffer touches them)."""
ALIGNMENT = 64
"""Every buffer starts at a multiple of this offset (a cache line; any dtype's alignment)."""
INLINE_LIMIT = 1 << 20
"""Bytes of array data outside the shared segments a write may carry by value to the persist
process; a write with more is done by the writer thread (see :func:`share_arrays`)."""
_PAGE = mmap.PAGESIZE

B = TypeVar("B")


def shared_memory_supported() -> bool:
    """True where segments can be made and passed on (``memfd_create`` and ``send_fds``)."""
    return hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


@dataclasses.dataclass(frozen=True)
class SharedRef:
    """Placeholder for one buffer in a shared skeleton: where it lies and how to view it."""

    segment: int
    offset: int
    nbytes: int
    kind: str  # "module:function" building the view in the persist process, see numpy_view
    dtype: Any  # a numpy dtype, a torch dtype or a dtype's name (all pickle by reference or value)
    shape: tuple[int, ...]


@dataclasses.dataclass
class _Segment:
    fd: int
    memory: mmap.mmap
    size: int
    address: int
    free: list[tuple[int, int]]  # (offset, size) of the free ranges, sorted, coalesced
    blocks: int = 0
    sent: bool = False


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class SharedArena:
    """Shared segments of the snapshot buffers; see the module docstring.

    ``new_buffer(view, view_path, nbytes, dtype, shape)`` places a buffer, views it and
    registers the view; ``release(view)`` returns its range (the memory of a range is given
    back to the system at once, a segment's descriptor is closed when its last buffer goes).
    The persist process learns new segments through :meth:`pending_fds` before it is sent a
    skeleton that uses them.
    """

    def __init__(self, segment_bytes: int = SEGMENT_BYTES) -> None:
        if not shared_memory_supported():
            raise OSError("shared snapshot buffers need os.memfd_create and socket.send_fds (Linux)")
        self._segment_bytes = segment_bytes
        self._ids = itertools.count(1)
        self._segments: dict[int, _Segment] = {}
        self._refs: dict[int, tuple[Any, SharedRef]] = {}  # id(view) -> (view, ref)
        self._lock = threading.Lock()
        self.failure: OSError | None = None
        """Why segments could not be had (see :func:`private_fallback`); None while they can."""
        _live_arenas.add(self)

    # -- placing buffers ---------------------------------------------------------------------

    def allocate(self, nbytes: int) -> tuple[int, int, mmap.mmap]:
        """A range of ``nbytes`` in some segment: ``(segment id, offset, segment mapping)``.

        Raises ``OSError`` when a new segment is needed and cannot be made.
        """
        size = _round_up(max(nbytes, 1), ALIGNMENT)
        with self._lock:
            for sid, seg in self._segments.items():
                offset = _take(seg.free, size)
                if offset is not None:
                    seg.blocks += 1
                    return sid, offset, seg.memory
            total = sum(seg.size for seg in self._segments.values())
            seg_size = _round_up(max(self._segment_bytes, size, total), _PAGE)
            sid, seg = next(self._ids), self._new_segment(seg_size)
            self._segments[sid] = seg
            offset = _take(seg.free, size)
            assert offset == 0
            seg.blocks += 1
            return sid, 0, seg.memory

    @staticmethod
    def _new_segment(size: int) -> _Segment:
        fd = os.memfd_create("autockpt-snapshot", getattr(os, "MFD_CLOEXEC", 1))
        try:
            os.ftruncate(fd, size)
            memory = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        address = ctypes.addressof(ctypes.c_char.from_buffer(memory))  # the temporary export ends here
        return _Segment(fd, memory, size, address, free=[(0, size)])

    def new_buffer(self, view: Callable[[Any, int, Any, tuple[int, ...]], Any], view_path: str, nbytes: int,
                   dtype: Any, shape: tuple[int, ...]) -> Any:
        """A fresh range of ``nbytes`` seen as ``view(memory, offset, dtype, shape)``, registered.

        ``view_path`` names ``view`` ("module:function") for the persist process.
        """
        segment, offset, memory = self.allocate(nbytes)
        try:
            buffer = view(memory, offset, dtype, shape)
        except BaseException:
            self._give_back(segment, offset, nbytes)
            raise
        self.register(buffer, SharedRef(segment, offset, nbytes, view_path, dtype, shape))
        return buffer

    def register(self, view: Any, ref: SharedRef) -> None:
        """Remember that ``view`` (the pool's buffer object) is the range ``ref`` names."""
        with self._lock:
            self._refs[id(view)] = (view, ref)

    def release(self, view: Any) -> None:
        """The pool dropped ``view``: forget it and give its range back."""
        with self._lock:
            entry = self._refs.pop(id(view), None)
        if entry is not None:
            ref = entry[1]
            self._give_back(ref.segment, ref.offset, ref.nbytes)

    def _give_back(self, sid: int, offset: int, nbytes: int) -> None:
        size = _round_up(max(nbytes, 1), ALIGNMENT)
        with self._lock:
            seg = self._segments.get(sid)
            if seg is None:
                return
            seg.blocks -= 1
            if seg.blocks == 0:  # the whole segment is free: close it (views keep their mapping)
                del self._segments[sid]
                os.close(seg.fd)
                return
            _put(seg.free, offset, size)
            start, end = _round_up(offset, _PAGE), (offset + size) // _PAGE * _PAGE
            if end > start and hasattr(mmap, "MADV_REMOVE"):
                try:  # give the range's whole pages back to the system (they read as zeros)
                    seg.memory.madvise(mmap.MADV_REMOVE, start, end - start)
                except (OSError, ValueError):
                    pass

    # -- finding buffers ---------------------------------------------------------------------

    def ref_of(self, value: Any) -> SharedRef | None:
        """The range of ``value`` if it is a buffer this arena made, else None."""
        entry = self._refs.get(id(value))
        return entry[1] if entry is not None and entry[0] is value else None

    def locate(self, address: int, nbytes: int) -> tuple[int, int] | None:
        """``(segment id, offset)`` of the memory at ``address``..``address + nbytes``, if a
        segment of this arena holds all of it."""
        with self._lock:
            for sid, seg in self._segments.items():
                if seg.address <= address and address + nbytes <= seg.address + seg.size:
                    return sid, address - seg.address
        return None

    # -- the persist process's view ------------------------------------------------------------

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
    def segment_count(self) -> int:
        """Open segments (each one descriptor in this process)."""
        with self._lock:
            return len(self._segments)

    @property
    def total_bytes(self) -> int:
        """Bytes of the live buffers (the segments' virtual size is larger)."""
        with self._lock:
            return sum(ref.nbytes for _view, ref in self._refs.values())

    def close(self) -> None:
        """Close every descriptor (views keep their mappings until they are dropped)."""
        with self._lock:
            segments, self._segments, self._refs = list(self._segments.values()), {}, {}
        for segment in segments:
            os.close(segment.fd)

    def _forget_in_child(self) -> None:
        """In a forked child: let go of the segments without touching the parent's (see :func:`_after_fork_in_child`)."""
        for seg in self._segments.values():
            _reserve(seg.address, seg.size)
            try:
                os.close(seg.fd)
            except OSError:
                pass
        self._segments, self._refs = {}, {}


_live_arenas: weakref.WeakSet[SharedArena] = weakref.WeakSet()

_MAP_FIXED, _MAP_NORESERVE = 0x10, 0x4000  # Linux (x86-64, arm64)


def _reserve(address: int, size: int) -> None:
    """Replace this process's mapping of ``address``..``address + size`` with inaccessible,
    unbacked memory (so nothing else is mapped there while views of it may still be freed)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | _MAP_NORESERVE
    libc.mmap(address, size, 0, flags, -1, 0)


def _after_fork_in_child() -> None:
    """A process forked from the training process (a data-loader worker, a user's helper) must
    not keep the snapshot memory alive after the training process is gone: its mappings of the
    segments are replaced by reservations, the segments' descriptors (the arena's, and the copies
    Python's mmap objects hold, which are pointed at ``/dev/null`` so their later close is
    harmless) are dropped. Snapshot buffers are not readable in such a child."""
    arenas = list(_live_arenas)
    if not arenas:
        return
    for arena in arenas:
        arena._forget_in_child()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for name in names:
            fd = int(name)
            try:
                if fd != null and os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:autockpt-snapshot"):
                    os.dup2(null, fd, inheritable=False)
            except OSError:
                continue
    finally:
        os.close(null)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _take(free: list[tuple[int, int]], size: int) -> int | None:
    """First fit: the offset of a free range of ``size`` bytes taken from ``free``, or None."""
    for i, (offset, length) in enumerate(free):
        if length >= size:
            if length == size:
                del free[i]
            else:
                free[i] = (offset + size, length - size)
            return offset
    return None


def _put(free: list[tuple[int, int]], offset: int, size: int) -> None:
    """Return ``offset..offset + size`` to ``free``, merged with its free neighbours."""
    i = bisect.bisect(free, (offset, size))
    if i < len(free) and offset + size == free[i][0]:
        size += free.pop(i)[1]
    if i > 0 and free[i - 1][0] + free[i - 1][1] == offset:
        offset, size = free[i - 1][0], free[i - 1][1] + size
        del free[i - 1]
        i -= 1
    free.insert(i, (offset, size))


def private_fallback(arena: SharedArena, shared: Callable[[tuple[int, ...], Any], B],
                     private: Callable[[tuple[int, ...], Any], B]) -> Callable[[tuple[int, ...], Any], B]:
    """An ``allocate`` for a :class:`BufferPool`: ``shared`` while segments can be had, then
    ``private`` (ordinary memory) after one warning; such buffers are written by the writer thread."""

    def allocate(shape: tuple[int, ...], dtype: Any) -> B:
        if arena.failure is None:
            try:
                return shared(shape, dtype)
            except OSError as exc:
                arena.failure = exc
                log.warning(
                    "autockpt: no shared memory for the persist process (%s: %s); snapshot buffers use "
                    "ordinary memory from now on and checkpoints are written by the writer thread",
                    type(exc).__name__, exc,
                )
        return private(shape, dtype)

    return allocate


class NotShareable(Exception):
    """A write holds more unshared array data than :data:`INLINE_LIMIT` (writer thread only)."""


def share_arrays(tree: Any, arena: SharedArena) -> Any:
    """``tree`` with every arena buffer replaced by its :class:`SharedRef`, for the persist process.

    Other numpy arrays travel by value up to :data:`INLINE_LIMIT` bytes in all; raises
    :class:`NotShareable` beyond (the writer thread then writes instead).
    """
    inline = 0

    def leaf(_path: str, value: np.ndarray) -> Any:
        nonlocal inline
        ref = arena.ref_of(value)
        if ref is not None:
            return ref
        inline += int(value.nbytes)
        if inline > INLINE_LIMIT:
            raise NotShareable(f"{inline} bytes of snapshot data are not in shared memory")
        return value

    return map_tree(tree, lambda v: isinstance(v, np.ndarray), leaf, other_fn=lambda v: v)


def rebuild_tree(skeleton: Any, view: Callable[[SharedRef], Any]) -> Any:
    """The inverse of :func:`share_arrays` in the persist process: ``view(ref)`` for each ref."""
    return map_tree(skeleton, lambda v: isinstance(v, SharedRef), lambda _p, ref: view(ref), other_fn=lambda v: v)


def numpy_shared_pool(arena: SharedArena) -> BufferPool[np.ndarray]:
    """A :class:`BufferPool` of numpy arrays in arena segments (the Keras adapter's buffers)."""

    def shared(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype=dtype)
        return arena.new_buffer(numpy_view, NUMPY_VIEW, nbytes, dtype, tuple(shape))

    allocate = private_fallback(arena, shared, lambda shape, dtype: np.empty(shape, dtype=dtype))
    return BufferPool(allocate=allocate, nbytes=lambda a: int(a.nbytes), release=arena.release, touch=touch_array)


def touch_array(array: np.ndarray) -> None:
    """Fault in every page of ``array`` (see :func:`~.buffers.fault_in`)."""
    fault_in(array.ctypes.data, array.nbytes)


def numpy_view(memory: Any, offset: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A numpy array of ``dtype`` and ``shape`` at ``offset`` of a mapped segment (both processes)."""
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(memory, dtype=dtype, count=count, offset=offset).reshape(shape)
