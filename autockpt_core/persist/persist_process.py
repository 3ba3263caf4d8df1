"""Phase 2 in a separate process: serialize, checksum and write without the training's GIL.

Why: a persist thread runs Python (torch.save's pickler, the checksum and write loop) in the
training process, and every time it holds the GIL the training thread waits for it. Measured
on the project's 2-core machine with ``examples/persist_interference.py`` (plain torch loop,
100 MB of state, one torch thread; docs/benchmarks.md): a Python thread spinning next to
training made steps 6.6× slower, a process spinning or copying memory on the other core
1.06–1.17×. So the training process only hands a persist process a small description of the
write (:meth:`PortableWrite.for_process_of`: its arguments, with each shared buffer replaced
by a :class:`~.shared_memory.SharedRef`), and that process, at a lower CPU priority
(``NICENESS``), rebuilds the arguments over the same shared memory and runs the same atomic
write (:meth:`.storage.LocalStorage.write_atomic`: temporary file, fsync, rename, directory
fsync). It unpickles objects of :data:`CHILD_MODULES` only, so a class defined in the
training script never has to exist there. The manifest commit and retention stay in the
training process's writer thread (small, and they order commits). When the persist process
fails a write, the writer thread writes that checkpoint itself and every later one
(:class:`~.writer.CheckpointWriter`), so the process never costs a checkpoint.

Protocol (a Unix stream socket pair; frames are an 8-byte length and a pickle): ``segments``
(followed by one message carrying the new segments' descriptors), ``import`` (modules to
load ahead, e.g. torch, while training warms up), ``write`` (answered by one reply frame),
``exit``. The child answers ``import`` with ``ready`` once its imports are done; until then
(about 3 s with torch on the project's machines) :meth:`PersistProcess.ready` is False and
the writer writes in its thread instead, so starting the process never delays a checkpoint.
A second pipe tells the child when the training process is gone: it then exits at
once, so a SIGKILLed job leaves at most a temporary file, which the next resume removes.

Threading: ``start`` on the training thread (``session.open()``) and again on the writer
thread (``ready``/``write_atomic`` replace a dead child), under a lock; ``close`` on the
training thread with no write in flight; one write at a time (the writer runs one persist
at a time).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import pickle
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from typing import IO, Any, Callable

from .shared_memory import NotShareable, SharedArena, share_arrays
from .storage import LocalStorage, WriteResult

log = logging.getLogger("autockpt")

NICENESS = 10
"""The persist process's ``nice`` increment: training threads win a contended core (CFS
weight 1024 vs 110), yet the persist still progresses when every core is busy."""
FD_BATCH = 200
"""Descriptors per message (Linux allows 253 per SCM_RIGHTS message)."""
CLOSE_TIMEOUT_S = 10.0
MAX_FAILED_STARTS = 3
CHILD_MODULE = "autockpt_core.persist.persist_child"
CHILD_MODULES = ("builtins", "copyreg", "collections", "numpy", "ml_dtypes", "torch", "autockpt_core", "autockpt_torch")
"""The only modules (and their submodules) whose objects the persist process unpickles; it
never imports the training script's classes."""


@dataclasses.dataclass(frozen=True)
class PortableWrite:
    """A snapshot's write as something another process can run.

    ``function`` ("module:function") is called as ``function(file, **kwargs)``: here by
    :meth:`run` (the writer thread), or in the persist process with the kwargs
    :meth:`for_process_of` makes: ``for_process(arena)`` when given (a write whose kwargs hold
    objects the persist process must not unpickle, e.g. torch.save's tree: see
    ``autockpt_torch.process_write``), else these kwargs with their shared numpy buffers as
    references (:func:`~.shared_memory.share_arrays`). What is sent may contain builtins,
    numpy arrays and dtypes, torch dtypes and references only (:data:`CHILD_MODULES`).
    """

    function: str
    kwargs: dict[str, Any]
    for_process: Callable[[SharedArena], PortableWrite | None] | None = dataclasses.field(
        default=None, compare=False, repr=False
    )

    def run(self, file: IO[bytes]) -> object:
        """Write here, in this process (the writer thread's path: the same function, the same bytes)."""
        return resolve(self.function)(file, **self.kwargs)

    def for_process_of(self, arena: SharedArena) -> PortableWrite | None:
        """The write the persist process runs over ``arena``; None when it cannot (writer thread)."""
        if self.for_process is not None:
            return self.for_process(arena)
        try:
            return PortableWrite(self.function, share_arrays(self.kwargs, arena))
        except NotShareable:
            return None


def resolve(path: str) -> Callable[..., Any]:
    """``"module:function"`` -> the function."""
    module, _, name = path.partition(":")
    target: Any = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


class PersistProcessError(OSError):
    """The persist process died or broke the protocol; the message says how."""


class PersistProcess:
    """Parent side of the persist process; see the module docstring."""

    def __init__(self, arena: SharedArena, modules: tuple[str, ...] = ()) -> None:
        self._arena = arena
        self._modules = modules
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._alive_w: int | None = None
        self._ready = False
        self._lock = threading.Lock()
        self._failed_starts = 0
        self.disabled = False
        """True once children kept dying before they were ready (see :meth:`start`)."""
        self.writes = 0
        """Checkpoint files this process (and its predecessors after a restart) wrote."""
        _live_processes.add(self)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the child (idempotent); it imports ``modules`` while the caller goes on.

        After ``MAX_FAILED_STARTS`` children in a row died before they were ready, or when
        none can be started at all, none is started again (:attr:`disabled`, logged once):
        the writer thread writes instead.
        """
        with self._lock:
            if self._proc is not None and self._proc.poll() is not None and not self._ready:
                self._failed_start()  # the last one died before it was ready
            if self.disabled or (self._proc is not None and self._proc.poll() is None):
                return
            self._discard()
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            alive_r, alive_w = os.pipe()
            # The child imports what this process imports: its sys.path (scripts that extend it).
            path = os.pathsep.join(p for p in sys.path if p)
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", CHILD_MODULE,
                     str(child.fileno()), str(alive_r), str(NICENESS)],
                    pass_fds=(child.fileno(), alive_r),
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONPATH": path},
                )  # fmt: skip
            except OSError as exc:  # no interpreter to start, no memory, ...: the writer thread writes
                parent.close()
                os.close(alive_w)
                self.disabled = True
                log.warning("autockpt: could not start the persist process (%s); checkpoints are written by the "
                            "writer thread instead", exc)
                return
            except BaseException:
                parent.close()
                os.close(alive_w)
                raise
            finally:
                child.close()
                os.close(alive_r)
            self._sock, self._alive_w, self._ready = parent, alive_w, False
            self._arena.resend_all()
            _send(parent, {"op": "import", "modules": list(self._modules)})

    def ready(self) -> bool:
        """True once the child has done its imports (writer thread; never blocks).

        Starts a child if none runs (after one died), which is then not ready yet.
        """
        if self._ready and self._proc is not None and self._proc.poll() is None:
            return True
        self.start()
        sock = self._sock
        if sock is None or not select.select([sock], [], [], 0)[0]:
            return False
        try:
            reply = _recv(sock)
        except (OSError, EOFError):
            self._failed_start()
            return False
        self._ready = reply.get("op") == "ready"
        self._failed_starts = 0
        return self._ready

    def _failed_start(self) -> None:
        proc = self._proc
        status = proc.wait(timeout=5) if proc is not None else None
        self._discard()
        self._failed_starts += 1
        if self._failed_starts >= MAX_FAILED_STARTS:
            self.disabled = True
            log.warning(
                "autockpt: the persist process exited (status %s) before it was ready, %d times in a row; "
                "checkpoints are written by the writer thread instead (see its error output above)",
                status, self._failed_starts,
            )

    def write_atomic(self, storage: LocalStorage, name: str, write: PortableWrite) -> WriteResult:
        """Have the child write ``name`` atomically into ``storage``'s directory (writer thread).

        ``write`` is what :meth:`PortableWrite.for_process_of` made. Waits for the child's
        imports if it is not :meth:`ready` yet. Raises the child's exception (e.g.
        ``OSError(ENOSPC)``), or :class:`PersistProcessError` if the child died during the
        write (its temporary file may be left); a new child is started at the next call.
        """
        self.start()  # a child that died while idle is replaced here, silently
        sock = self._sock
        if sock is None:
            raise PersistProcessError(f"autockpt's persist process is disabled; {name} was not written by it")
        try:
            if not self._ready:  # its answer to "import" comes first
                self._ready = _recv(sock).get("op") == "ready"
            fresh = self._arena.pending_fds()
            for i in range(0, len(fresh), FD_BATCH):
                batch = fresh[i : i + FD_BATCH]
                _send(sock, {"op": "segments", "ids": [sid for sid, _fd in batch]})
                socket.send_fds(sock, [b"F"], [fd for _sid, fd in batch])
            _send(sock, {
                "op": "write", "root": str(storage.root), "fsync": storage.fsync, "name": name,
                "function": write.function, "kwargs": write.kwargs, "live": self._arena.live_segments(),
            })  # fmt: skip
            reply = _recv(sock)
        except (OSError, EOFError) as exc:
            raise self._died(name, exc) from None
        if reply.get("ok"):
            self.writes += 1
            return WriteResult(*reply["result"])
        error = reply.get("error")
        if isinstance(error, BaseException):
            raise error
        raise PersistProcessError(f"the persist process failed writing {name}: {reply.get('text', 'unknown error')}")

    @property
    def arena(self) -> SharedArena:
        return self._arena

    def disable(self) -> None:
        """Stop using a child for the rest of the session (writer thread, after the writer
        thread had to take a write over); the child is ended."""
        with self._lock:
            self.disabled = True
            self._discard()

    def wait_ready(self, timeout: float) -> bool:
        """Block until :meth:`ready` (polling), at most ``timeout`` seconds; no persist may run."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.disabled or time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _died(self, name: str, exc: BaseException) -> PersistProcessError:
        proc = self._proc
        status = proc.wait(timeout=5) if proc is not None else None
        how = f"signal {-status}" if status is not None and status < 0 else f"status {status}"
        self._discard()
        return PersistProcessError(
            f"autockpt's persist process (pid {proc.pid if proc else '?'}) ended ({how}) while writing {name} "
            f"({type(exc).__name__}: {exc}); a new one is started for the next checkpoint"
        )

    def close(self) -> None:
        """End the child (training thread, no write in flight; idempotent).

        A ready child is asked to exit; one still importing is killed at once (it holds no
        work), so closing never waits for its imports.
        """
        with self._lock:
            proc, sock = self._proc, self._sock
            if proc is None:
                return
            try:
                if sock is not None and proc.poll() is None and self._ready:
                    _send(sock, {"op": "exit"})
                    proc.wait(timeout=CLOSE_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            finally:
                self._discard()

    def _discard(self) -> None:
        if self._sock is not None:
            self._sock.close()
        if self._alive_w is not None:
            os.close(self._alive_w)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc, self._sock, self._alive_w, self._ready = None, None, None, False

    def _forget_in_child(self) -> None:
        """In a forked child: close the inherited ends (the persist process must see the
        training process go when it dies, whatever it forked); the child is not ours to end."""
        if self._sock is not None:
            self._sock.close()
        if self._alive_w is not None:
            try:
                os.close(self._alive_w)
            except OSError:
                pass
        if self._proc is not None:
            self._proc.returncode = 0  # not this process's child: nothing to wait for or warn about
        self._proc, self._sock, self._alive_w, self._ready, self.disabled = None, None, None, False, True


_live_processes: weakref.WeakSet[PersistProcess] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for process in list(_live_processes):
        process._forget_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


_HEADER = struct.Struct("<Q")


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv(sock: socket.socket) -> dict[str, Any]:
    return pickle.loads(_recv_frame(sock))  # noqa: S301 - our own child's frames


def _recv_frame(sock: socket.socket) -> bytes:
    """One frame's pickled bytes (the child unpickles them with its restricted unpickler)."""
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return _recv_exact(sock, length)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes (never more: a descriptor message may follow)."""
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError("the other side closed the connection")
        out += chunk
    return bytes(out)
