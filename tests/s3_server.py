"""A real S3-compatible server for tests: ``moto.server`` started as its own process on
127.0.0.1 (never any other address), with a bucket, and the fsspec options that reach it.

``S3Server.start()`` picks a free port, starts ``python -m moto.server -H 127.0.0.1 -p PORT``,
waits until it answers and creates ``bucket``; ``stop()`` terminates it (its data is in its
memory and goes with it). Tests skip when moto or s3fs is not installed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

HOST = "127.0.0.1"
CREDENTIALS = {"key": "testing", "secret": "testing"}


def _die_with_parent() -> None:
    """In the server process: SIGTERM when the test process dies, however it dies (Linux)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class S3Server:
    def __init__(self, bucket: str = "ckpts") -> None:
        self.bucket = bucket
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """What a user passes as ``storage_options`` for this server."""
        return {"endpoint_url": self.endpoint, **CREDENTIALS}

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def start(self, timeout: float = 30.0) -> "S3Server":
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            self.port = probe.getsockname()[1]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server on {self.endpoint} did not start")
                time.sleep(0.1)
        self.filesystem().mkdir(self.bucket)
        return self

    def filesystem(self) -> Any:
        """A fresh s3fs filesystem on this server (no cached listings)."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
