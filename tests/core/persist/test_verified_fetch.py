"""A resume's single download of a checkpoint under a URL (autockpt_core/persist/verified_fetch.py):
the object is read once, verified on the way, and its local copy kept or removed."""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from autockpt_core import LocalStorage, find_latest_valid, read_manifest
from autockpt_core.persist import verified_fetch
from autockpt_core.persist.manifest import MISSING, CheckpointRecord, write_manifest
from autockpt_core.persist.storage import FsspecStorage
from autockpt_core.persist.verified_fetch import PREFIX, FetchWhileVerifying


def _commit(storage: Any, name: str, step: int, payload: bytes) -> CheckpointRecord:
    res = storage.write_atomic(name, lambda f: f.write(payload))
    record = CheckpointRecord.from_write(res, step, 0, "x")
    write_manifest(storage, read_manifest(storage) + [record])
    return record


class CountingReads:
    """Wraps a storage's ``open_read`` and counts the bytes read per name."""

    def __init__(self, storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes: dict[str, int] = {}
        opened = storage.open_read

        def open_read(name: str) -> Any:
            raw = opened(name)
            counts = self.bytes

            class Counted(io.RawIOBase):
                def read(self, n: int = -1) -> bytes:
                    data = raw.read(n)
                    counts[name] = counts.get(name, 0) + len(data)
                    return data

                def readable(self) -> bool:
                    return True

                def close(self) -> None:
                    raw.close()
                    super().close()

            return Counted()

        monkeypatch.setattr(storage, "open_read", open_read)


@pytest.fixture
def remote() -> FsspecStorage:
    return FsspecStorage(f"memory://verified-fetch/{uuid.uuid4().hex[:8]}")


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verified_fetch, "BLOCK", 1000)  # many blocks per object


def copies(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_the_object_that_verifies_is_downloaded_once_and_its_copy_handed_over(
    remote: FsspecStorage, tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = os.urandom(12_345)
    record = _commit(remote, "c1", 1, payload)
    reads = CountingReads(remote, monkeypatch)
    fetches = FetchWhileVerifying(remote, tmp_path)
    assert find_latest_valid(remote, check=fetches.check).name == record.name  # type: ignore[union-attr]
    assert reads.bytes["c1"] == 12_345  # one pass over the object
    path = fetches.take(record)
    assert path is not None and Path(path).parent == tmp_path and Path(path).name.startswith(PREFIX)
    assert Path(path).read_bytes() == payload
    assert fetches.take(record) is None  # once
    fetches.discard()
    assert Path(path).exists()  # taken: the caller's to remove


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda payload: payload[:-10], "size 4311 != 4321"),
        (lambda payload: payload + b"!", "size 4322 != 4321"),
        (lambda payload: bytes([payload[0] ^ 1]) + payload[1:], "checksum"),
        (None, MISSING),
    ],
    ids=["truncated", "longer", "bit-flip", "missing"],
)
def test_a_damaged_newest_object_leaves_no_copy_and_the_older_one_is_fetched(
    remote: FsspecStorage, tmp_path: Path, small_blocks: None, damage: Any, problem: str
) -> None:
    older = _commit(remote, "c1", 1, b"old" * 1000)
    payload = os.urandom(4321)
    newest = _commit(remote, "c2", 2, payload)
    if damage is None:
        remote.delete("c2")
    else:
        remote.write_atomic("c2", lambda f: f.write(damage(payload)))
    fetches = FetchWhileVerifying(remote, tmp_path)
    assert problem in (fetches.check(newest) or "")
    assert copies(tmp_path) == []  # nothing of the damaged object stays
    with pytest.warns(RuntimeWarning, match="skipping checkpoint c2"):
        assert find_latest_valid(remote, check=fetches.check).name == older.name  # type: ignore[union-attr]
    path = fetches.take(older)
    assert path is not None and Path(path).read_bytes() == b"old" * 1000
    assert copies(tmp_path) == [Path(path).name]


def test_a_copy_not_taken_is_removed_by_the_next_check_or_by_discard(remote: FsspecStorage, tmp_path: Path) -> None:
    first = _commit(remote, "c1", 1, b"a" * 100)
    second = _commit(remote, "c2", 2, b"b" * 100)
    fetches = FetchWhileVerifying(remote, tmp_path)
    assert fetches.check(first) is None
    assert fetches.kept_path(first) is not None and fetches.kept_path(second) is None
    assert fetches.check(second) is None
    assert len(copies(tmp_path)) == 1  # at most one candidate's copy on disk
    assert fetches.take(first) is None  # not the one kept
    fetches.discard()
    assert copies(tmp_path) == []


def test_local_and_multi_file_records_are_only_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = LocalStorage(tmp_path / "ck")
    record = _commit(local, "c1", 1, b"x" * 50)
    (tmp_path / "copies").mkdir()
    fetches = FetchWhileVerifying(local, tmp_path / "copies")
    assert not fetches.fetches(record)
    assert fetches.check(record) is None and fetches.take(record) is None
    multi = CheckpointRecord("set", 1, 0, 0.0, 3, "", "crc32", "x", files={"a.bin": [3, "00000000"]})
    assert not FetchWhileVerifying(FsspecStorage(f"memory://verified-fetch/{uuid.uuid4().hex[:8]}")).fetches(multi)
    assert copies(tmp_path / "copies") == []


def test_a_read_error_midway_leaves_no_copy(
    remote: FsspecStorage, tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = _commit(remote, "c1", 1, os.urandom(5000))
    opened = remote.open_read

    def failing(name: str) -> Any:
        raw = opened(name)

        class Failing(io.RawIOBase):
            def read(self, n: int = -1) -> bytes:
                if raw.tell() >= 3000:
                    raise OSError("connection reset")
                return raw.read(n)

            def readable(self) -> bool:
                return True

        return Failing()

    monkeypatch.setattr(remote, "open_read", failing)
    with pytest.raises(OSError, match="connection reset"):
        FetchWhileVerifying(remote, tmp_path).check(record)
    assert copies(tmp_path) == []
