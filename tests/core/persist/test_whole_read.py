import dataclasses
import io
import os
import uuid
import zlib

import numpy as np
import pytest

from autockpt_core import LocalStorage, find_latest_valid, read_manifest
from autockpt_core.persist import whole_read
from autockpt_core.persist.manifest import CheckpointRecord, write_manifest
from autockpt_core.persist.storage import FsspecStorage
from autockpt_core.persist.whole_read import ReadWhileVerifying, map_whole, read_whole


def _commit(storage, name: str, step: int, payload: bytes) -> CheckpointRecord:
    res = storage.write_atomic(name, lambda f: f.write(payload))
    record = CheckpointRecord.from_write(res, step, 0, "x")
    write_manifest(storage, read_manifest(storage) + [record])
    return record


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(whole_read, "BLOCK", 1000)  # many blocks, so the CRC runs behind the reads


class _ReadOnly(io.RawIOBase):
    """A stream with ``read`` but no usable ``readinto`` (as some fsspec files)."""

    def __init__(self, payload: bytes) -> None:
        self._data = io.BytesIO(payload)

    def read(self, n: int = -1) -> bytes:
        return self._data.read(min(n, 777))  # short reads

    readinto = None  # type: ignore[assignment]


@pytest.mark.parametrize("length", [0, 1, 999, 1000, 1001, 12_345])
@pytest.mark.parametrize("make", [io.BytesIO, _ReadOnly], ids=["readinto", "read"])
def test_read_whole_returns_every_byte_and_their_crc(small_blocks, length, make) -> None:
    payload = os.urandom(length)
    data, crc = read_whole(make(payload), length)
    assert data.dtype == np.uint8 and data.tobytes() == payload
    assert crc == zlib.crc32(payload)


def test_read_whole_shows_a_file_shorter_or_longer_than_expected(small_blocks) -> None:
    payload = os.urandom(5000)
    assert len(read_whole(io.BytesIO(payload), 6000)[0]) == 5000
    assert len(read_whole(io.BytesIO(payload), 4000)[0]) == 4001


def test_a_read_error_propagates(small_blocks) -> None:
    class Failing(io.BytesIO):
        def readinto(self, into):  # type: ignore[override]
            if self.tell() >= 3000:
                raise OSError("disk gone")
            return super().readinto(into)

    with pytest.raises(OSError, match="disk gone"):
        read_whole(Failing(os.urandom(8000)), 8000)


@pytest.mark.parametrize("length", [0, 1, 4096, 70_001])
def test_map_whole_gives_the_files_bytes_writable_without_changing_the_file(tmp_path, small_blocks, length) -> None:
    payload = os.urandom(length)
    path = tmp_path / "f"
    path.write_bytes(payload)
    data, crc = map_whole(path)
    assert data.tobytes() == payload and crc == zlib.crc32(payload)
    assert data.flags.writeable
    if length:
        data[0] ^= 0xFF  # copy-on-write: private to this process
        assert path.read_bytes() == payload


def test_the_record_that_verifies_is_kept_once(tmp_path, small_blocks) -> None:
    storage = LocalStorage(tmp_path)
    _commit(storage, "c1", 1, os.urandom(4321))
    reads = ReadWhileVerifying(storage)
    assert find_latest_valid(storage, check=reads.check).name == "c1"
    other = _commit(storage, "c2", 2, b"x")
    assert reads.take(other) is None  # another record's bytes were not read here
    assert find_latest_valid(storage, check=reads.check).name == "c2"
    assert reads.take(other).tobytes() == b"x"
    assert reads.take(other) is None  # once


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-10]), "size 4311 != 4321"),
        (lambda p: p.write_bytes(p.read_bytes() + b"!"), "size 4322 != 4321"),
        (lambda p: p.write_bytes(bytes([p.read_bytes()[0] ^ 1]) + p.read_bytes()[1:]), "checksum"),
        (lambda p: p.unlink(), "file missing"),
    ],
    ids=["truncated", "longer", "bit-flip", "missing"],
)
def test_a_damaged_newest_file_falls_back_to_the_older_bytes(tmp_path, small_blocks, damage, problem) -> None:
    storage = LocalStorage(tmp_path)
    older = _commit(storage, "c1", 1, b"old" * 1000)
    newest = _commit(storage, "c2", 2, os.urandom(4321))
    damage(tmp_path / "c2")
    reads = ReadWhileVerifying(storage)
    assert reads.check(newest) is not None and problem in reads.check(newest)
    with pytest.warns(RuntimeWarning, match="skipping checkpoint c2"):
        assert find_latest_valid(storage, check=reads.check).name == "c1"
    assert reads.take(older).tobytes() == b"old" * 1000


def test_a_remote_file_longer_than_its_record_is_found_without_reading_it_all(small_blocks) -> None:
    storage = FsspecStorage(f"memory://whole-read/{uuid.uuid4().hex[:8]}")
    record = _commit(storage, "c1", 1, os.urandom(3000))
    storage.write_atomic("c1", lambda f: f.write(os.urandom(9000)))
    assert "size 3001 or more != 3000" in (ReadWhileVerifying(storage).check(record) or "")


def test_object_storage_records_are_read_whole_too(small_blocks) -> None:
    storage = FsspecStorage(f"memory://whole-read/{uuid.uuid4().hex[:8]}")
    payload = os.urandom(5555)
    record = _commit(storage, "c1", 1, payload)
    reads = ReadWhileVerifying(storage)
    assert reads.check(record) is None
    assert reads.take(record).tobytes() == payload


def test_multi_file_records_are_verified_by_verify_and_not_kept(tmp_path) -> None:
    storage = LocalStorage(tmp_path)
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "a.bin").write_bytes(b"abc")
    good = CheckpointRecord("set", 1, 0, 0.0, 3, "", "crc32", "x", files={"a.bin": [3, f"{zlib.crc32(b'abc'):08x}"]})
    bad = dataclasses.replace(good, files={"a.bin": [3, "0badc0de"]})
    reads = ReadWhileVerifying(storage)
    assert reads.check(good) is None and reads.take(good) is None
    assert "checksum" in (reads.check(bad) or "")


def test_a_local_file_of_the_wrong_size_is_refused_without_reading_it(tmp_path, monkeypatch) -> None:
    storage = LocalStorage(tmp_path)
    record = _commit(storage, "c1", 1, b"a" * 100)
    (tmp_path / "c1").write_bytes(b"a" * 10_000)
    monkeypatch.setattr(whole_read, "map_whole", lambda path: pytest.fail("read a file of the wrong size"))
    assert ReadWhileVerifying(storage).check(record) == "size 10000 != 100 in manifest (truncated or torn file)"
