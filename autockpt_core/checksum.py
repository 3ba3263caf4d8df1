"""Checksums computed while bytes are written, and verified when a checkpoint is loaded.

CRC-32 (zlib) is used: it detects torn writes, truncation and bit flips, and at ~1.9 GB/s on
the project's CPU machines it is faster than the disk, where SHA-256 (~1.1 GB/s) would halve
persist throughput. The manifest records the algorithm, so it can change without breaking
old checkpoints.
"""

from __future__ import annotations

import zlib
from typing import IO, Any, Iterable

ALGORITHM = "crc32"
_CHUNK = 8 * 1024 * 1024


class Crc32:
    """Incremental CRC-32 with the ``update``/``hexdigest`` shape of hashlib objects."""

    name = ALGORITHM

    def __init__(self) -> None:
        self._value = 0

    def update(self, data: Any) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value & 0xFFFFFFFF:08x}"


class HashingWriter:
    """A write-only file wrapper that checksums and counts every byte passing through."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._hash = Crc32()
        self.size = 0

    def write(self, data: Any) -> int:
        """Write all of ``data``: unbuffered raw files may write only part of a large buffer
        (Linux caps one write at ~2 GiB) and callers such as torch.save ignore the count."""
        view = memoryview(data).cast("B")
        n = len(view)
        self._hash.update(view)
        done = 0
        while done < n:
            written = self._raw.write(view[done:])
            if written == 0:
                raise OSError(f"write made no progress after {self.size + done} bytes")
            done += n - done if written is None else written
        self.size += n
        return n

    def flush(self) -> None:
        self._raw.flush()

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return bool(getattr(self._raw, "closed", False))

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def checksum_stream(stream: IO[bytes]) -> tuple[str, int]:
    """CRC-32 hex digest and size of everything left in ``stream``."""
    h = Crc32()
    size = 0
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            return h.hexdigest(), size
        h.update(chunk)
        size += len(chunk)


def checksum_bytes(chunks: Iterable[bytes]) -> str:
    h = Crc32()
    for c in chunks:
        h.update(c)
    return h.hexdigest()
