"""A cloud metadata service on 127.0.0.1 for the preemption-notice tests: AWS IMDSv2, GCE and
Azure Scheduled Events as their endpoints answer, and a plain ``/notice`` URL; no notice until
``notice`` is set. Every request is recorded in ``seen``."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any


class Metadata(http.server.ThreadingHTTPServer):
    """A metadata service: no notice until ``notice`` is set; every request is recorded."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.notice = False
        self.seen: list[tuple[str, str, dict[str, str]]] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: Metadata

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:  # noqa: N802
        self.server.seen.append(("PUT", self.path, dict(self.headers)))
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self._answer(200, "TOKEN")
        return self._answer(405)

    def do_GET(self) -> None:  # noqa: N802
        self.server.seen.append(("GET", self.path, dict(self.headers)))
        notice = self.server.notice
        if self.path == "/latest/meta-data/spot/instance-action":
            if self.headers.get("X-aws-ec2-metadata-token") != "TOKEN":
                return self._answer(401)
            return self._answer(200, '{"action": "terminate", "time": "2026-11-28T21:00:00Z"}') if notice else self._answer(404)
        if self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._answer(403)
            return self._answer(200, "TRUE" if notice else "FALSE")
        if self.path.startswith("/metadata/scheduledevents"):
            events = [{"EventType": "Freeze", "NotBefore": "x"}]
            events += [{"EventType": "Preempt", "NotBefore": "Sat, 28 Nov 2026 21:00:00 GMT"}] if notice else []
            return self._answer(200, json.dumps({"DocumentIncarnation": 1, "Events": events}))
        if self.path == "/notice":
            return self._answer(200, "spot reclaim in 30 s") if notice else self._answer(404)
        return self._answer(404)


@contextlib.contextmanager
def serving() -> Iterator[Metadata]:
    server = Metadata()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
