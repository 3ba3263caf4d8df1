import io
import zlib

import pytest

from autockpt_core.persist import checksum
from autockpt_core.persist.checksum import HashingWriter, checksum_stream


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


@pytest.mark.parametrize("length", [0, 1, 9_000_001])
def test_checksum_stream_of_a_file_by_map_and_of_a_stream_agree(tmp_path, length, monkeypatch) -> None:
    payload = bytes(range(256)) * (length // 256) + b"x" * (length % 256)
    path = tmp_path / "f"
    path.write_bytes(payload)
    mapped: list[bool] = []
    real = checksum._mapped
    monkeypatch.setattr(checksum, "_mapped", lambda stream: mapped.append((m := real(stream)) is not None) or m)
    expected = (f"{zlib.crc32(payload):08x}", length)
    with open(path, "rb") as f:
        assert checksum_stream(f) == expected
    assert checksum_stream(io.BytesIO(payload)) == expected
    with open(path, "rb") as f:  # not at its start: the rest of the stream only
        f.read(min(length, 5))
        rest = payload[5:]
        assert checksum_stream(f) == (f"{zlib.crc32(rest):08x}", len(rest))
    assert mapped == [length > 0, False, False]  # an empty file cannot be mapped
