"""A TCP proxy on 127.0.0.1 that gives a test the faults a network gives: slow, stalled, cut.

Put it between a client and a real server (the moto S3 server of ``tests/s3_server.py``) and
point the client's endpoint at :attr:`FaultProxy.endpoint`. Every byte goes through two pump
threads per connection, so the faults act on real sockets, not on patched methods:

- ``rate``: bytes per second in each direction (None: as fast as the machine goes). An upload
  of ``n`` bytes then takes at least ``n / rate`` seconds.
- ``stall()``/``resume()``: while stalled, nothing is forwarded and new connections wait; the
  client sees a server that accepted and went silent (a hung mount, a black-holed route).
- ``cut()``: close every open connection now (a reset in the middle of a request).
- ``refuse``: while True, new connections are closed as soon as they are accepted (an outage).

Call order: ``start()`` (picks a free port), the faults at any time from any thread, ``stop()``.
The pump threads are daemons; ``stop()`` closes the listening socket and every connection.
"""

from __future__ import annotations

import socket
import threading
import time

HOST = "127.0.0.1"
CHUNK = 16 * 1024


class FaultProxy:
    def __init__(self, upstream_port: int, rate: float | None = None) -> None:
        self.upstream = (HOST, upstream_port)
        self.rate = rate
        self.refuse = False
        self.port = 0
        self.forwarded = 0
        """Bytes forwarded client to server, for tests that check an upload was under way."""
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> "FaultProxy":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, 0))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, name="fault-proxy-accept", daemon=True).start()
        return self

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def cut(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            _close(sock)

    def stop(self) -> None:
        self.resume()
        if self._listener is not None:
            _close(self._listener)
            self._listener = None
        self.cut()

    def _accept(self) -> None:
        listener = self._listener
        while listener is not None:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self.refuse:
                _close(client)
                continue
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._flowing.wait()
        try:
            server = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            _close(client)
            return
        server.settimeout(None)
        with self._lock:
            self._sockets.update((client, server))
        threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        try:
            while True:
                data = source.recv(CHUNK)
                if not data:
                    break
                self._flowing.wait()
                sink.sendall(data)
                if upstream:
                    self.forwarded += len(data)
                rate = self.rate
                if rate:
                    time.sleep(len(data) / rate)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
