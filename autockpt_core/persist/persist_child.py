"""The persist process's main loop: ``python -m autockpt_core.persist.persist_child SOCK ALIVE NICE``.

Started by :class:`~.persist_process.PersistProcess` (see there for the protocol). ``SOCK``:
its end of the socket pair; ``ALIVE``: the read end of a pipe whose write end only the
training process holds (end of file = the training process is gone: exit at once, whatever
is being written; the next resume removes the temporary file); ``NICE``: the ``nice``
increment. Imports only the core and numpy until a job names a function in another module,
and unpickles objects of ``CHILD_MODULES`` only: a message that needs anything else (a
class of the training script) is answered with an error, which makes the training
process's writer thread write that checkpoint itself.

Signals: see :data:`IGNORED_SIGNALS`. Ends with ``os._exit`` (no interpreter teardown) on
``exit`` or end of file.

Threading: the main thread serves requests one at a time; a daemon thread watches ``ALIVE``.
"""

from __future__ import annotations

import importlib
import io
import mmap
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

from .persist_process import CHILD_MODULES, _recv_frame, _send, resolve
from .shared_memory import SharedRef, rebuild_tree
from .storage import LocalStorage

IGNORED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
"""Ctrl-C in a terminal and preemption signals (SLURM, torchrun) reach the whole process
group; the training process decides what happens (e.g. an emergency checkpoint, which this
process then writes). The child ends on ``exit``, when the training process is gone, or by
SIGKILL."""


def _watch_parent(alive_fd: int) -> None:
    while True:
        try:
            if not os.read(alive_fd, 1):
                os._exit(0)
        except InterruptedError:
            continue
        except OSError:
            os._exit(0)


class Server:
    """The child's state: mapped segments and storages (one per directory)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.segments: dict[int, mmap.mmap] = {}
        self.storages: dict[tuple[str, bool], LocalStorage] = {}

    def serve(self) -> None:
        while True:
            try:
                frame = _recv_frame(self.sock)
            except (EOFError, ConnectionResetError):  # the training process closed (or died): done
                return
            try:
                message = _loads(frame)
            except Exception as exc:  # noqa: BLE001 - only a write's arguments can fail here
                _send(self.sock, _error_reply(exc))
                continue
            op = message["op"]
            if op == "exit":
                return
            if op == "segments":
                self._map(message["ids"])
            elif op == "import":
                for module in message["modules"]:
                    try:
                        importlib.import_module(module)
                    except Exception:  # noqa: BLE001 - reported by the write that needs it
                        pass
                _send(self.sock, {"op": "ready"})
            elif op == "write":
                _send(self.sock, self._write(message))

    def _map(self, ids: list[int]) -> None:
        _data, fds, _flags, _addr = socket.recv_fds(self.sock, 1, len(ids))
        for sid, fd in zip(ids, fds):
            try:
                self.segments[sid] = mmap.mmap(fd, 0)
            finally:
                os.close(fd)

    def view(self, ref: SharedRef) -> Any:
        return resolve(ref.kind)(self.segments[ref.segment], ref.offset, ref.dtype, ref.shape)

    def _write(self, message: dict[str, Any]) -> dict[str, Any]:
        live = set(message["live"])
        for sid in [s for s in self.segments if s not in live]:
            del self.segments[sid]  # unmapped once no view of it is left
        start = time.perf_counter()
        try:
            key = (message["root"], bool(message["fsync"]))
            storage = self.storages.get(key) or self.storages.setdefault(key, LocalStorage(key[0], fsync=key[1]))
            function = resolve(message["function"])
            kwargs = rebuild_tree(message["kwargs"], self.view)
            result = storage.write_atomic(message["name"], lambda file: function(file, **kwargs))
        except BaseException as exc:  # reported to the training process, which raises it
            return _error_reply(exc)
        return {"ok": True, "result": (result.name, result.size, result.checksum, result.algorithm),
                "seconds": time.perf_counter() - start}


class _Unpickler(pickle.Unpickler):
    """Unpickles objects of :data:`CHILD_MODULES` only: never the training script's classes."""

    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] not in CHILD_MODULES:
            raise pickle.UnpicklingError(
                f"the persist process does not load {module}.{name} (only objects of {', '.join(CHILD_MODULES)})"
            )
        return super().find_class(module, name)


def _loads(frame: bytes) -> Any:
    return _Unpickler(io.BytesIO(frame)).load()


def _error_reply(exc: BaseException) -> dict[str, Any]:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    try:
        pickle.loads(pickle.dumps(exc))
        return {"ok": False, "error": exc, "text": text}
    except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
        return {"ok": False, "text": text + "\n" + traceback.format_exc()}


def main(argv: list[str]) -> NoReturn:
    sock_fd, alive_fd, niceness = int(argv[0]), int(argv[1]), int(argv[2])
    for name in IGNORED_SIGNALS:  # a signal to the whole process group must not cut a write short
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    if niceness:
        os.nice(niceness)
    threading.Thread(target=_watch_parent, args=(alive_fd,), name="autockpt-parent-watch", daemon=True).start()
    with socket.socket(fileno=sock_fd) as sock:
        Server(sock).serve()
    # Every write was committed and answered before the next message was read: nothing is
    # left to do, so skip the interpreter's teardown (with torch imported, about half a second
    # that the training process's end-of-fit waits for).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":  # pragma: no cover - run as a process
    main(sys.argv[1:])
