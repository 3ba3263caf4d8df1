"""The persist write path: small writes coalesced, large ones passed through in order, the CRC
computed in a helper thread beside a large write, writeback started in chunks."""

from __future__ import annotations

import io
import os
import zlib
from typing import Any

import pytest

from autockpt_core import LocalStorage
from autockpt_core.persist import storage as storage_mod
from autockpt_core.persist.checksum import HashingWriter


class CountingRaw(io.RawIOBase):
    def __init__(self) -> None:
        self.calls: list[int] = []
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        self.calls.append(len(view))
        self.data += view
        return len(view)


def crc(data: bytes) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def test_small_writes_are_coalesced_and_large_ones_pass_through_in_order() -> None:
    raw = CountingRaw()
    writer = HashingWriter(raw, coalesce=64, parallel_min=1 << 40)
    parts = [b"a" * 10, b"b" * 20, b"c" * 100, b"d" * 5, b"e" * 70]
    for p in parts:
        writer.write(p)
    writer.flush()
    assert bytes(raw.data) == b"".join(parts)
    assert raw.calls == [30, 100, 5, 70]  # 10+20 gathered; 100 direct; 5 drained before the direct 70
    assert writer.size == sum(map(len, parts))
    assert writer.hexdigest() == crc(b"".join(parts))


def test_parallel_crc_matches_zlib_and_the_helper_stops_on_close() -> None:
    raw = CountingRaw()
    writer = HashingWriter(raw, parallel_min=16)
    payload = os.urandom(5000)
    writer.write(b"head")  # small: checksummed inline
    writer.write(payload)  # large: checksummed by the helper while written
    writer.write(memoryview(payload)[:100])
    helper = writer._helper
    assert helper is not None and helper._thread.is_alive()
    writer.close()
    helper._thread.join(timeout=5)
    assert not helper._thread.is_alive()
    writer.close()  # idempotent
    assert writer.hexdigest() == crc(b"head" + payload + payload[:100])


def test_a_failing_raw_write_still_waits_for_the_crc_helper() -> None:
    class Broken(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:  # type: ignore[override]
            raise OSError(28, "No space left on device")

    writer = HashingWriter(Broken(), parallel_min=16)
    with pytest.raises(OSError, match="No space"):
        writer.write(b"x" * 100)
    writer.close()


def test_local_storage_starts_writeback_in_chunks(tmp_path, monkeypatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(storage_mod, "WRITEBACK_CHUNK", 1000)
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: calls.append((off, n)), raising=False)
    payload = os.urandom(4500)
    result = LocalStorage(tmp_path).write_atomic("f.bin", lambda f: f.write(payload))
    assert (tmp_path / "f.bin").read_bytes() == payload
    assert result.size == 4500 and result.checksum == crc(payload)
    assert calls == [(0, 1000), (1000, 1000), (2000, 1000), (3000, 1000)]
