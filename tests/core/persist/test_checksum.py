import io
import zlib

import pytest

from autockpt_core.persist.checksum import HashingWriter


class ShortWrites(io.RawIOBase):
    """A raw file that accepts at most ``limit`` bytes per write, like write(2) past 2 GiB."""

    def __init__(self, limit: int) -> None:
        self.limit, self.data = limit, bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        chunk = bytes(memoryview(data).cast("B")[: self.limit])
        self.data += chunk
        return len(chunk)


def test_short_writes_are_completed_and_counted_once() -> None:
    raw = ShortWrites(limit=7)
    writer = HashingWriter(raw)
    payload = bytes(range(256)) * 3
    assert writer.write(payload) == len(payload)
    assert writer.write(memoryview(b"tail")) == 4
    assert bytes(raw.data) == payload + b"tail"
    assert writer.size == len(payload) + 4
    assert writer.hexdigest() == f"{zlib.crc32(payload + b'tail') & 0xFFFFFFFF:08x}"


def test_a_write_that_makes_no_progress_raises() -> None:
    with pytest.raises(OSError, match="no progress"):
        HashingWriter(ShortWrites(limit=0)).write(b"abc")
