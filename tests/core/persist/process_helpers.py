"""Functions the persist process runs in tests (imported there by name)."""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from typing import IO, Any


@dataclasses.dataclass
class Hyper:
    """A class of the test's own module: the persist process must refuse to load it."""

    n: int


def raise_value_error(file: IO[bytes], *, data: Any) -> None:
    raise ValueError("broken in the child")


def write_bytes(file: IO[bytes], *, data: Any, extra: Any = None) -> None:
    file.write(memoryview(data).cast("B"))


def disk_full(file: IO[bytes], *, data: Any) -> None:
    file.write(b"partial")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def slow_write(file: IO[bytes], *, data: Any, marker: str) -> None:
    """Writes a little, says so through ``marker``, then waits to be killed."""
    file.write(b"partial")
    file.flush()
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
