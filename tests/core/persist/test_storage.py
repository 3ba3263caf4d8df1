import errno
import os

import pytest

from autockpt_core.persist.checksum import checksum_stream
from autockpt_core.persist.storage import (
    TEMP_PREFIX,
    FsspecStorage,
    LocalStorage,
    NotDurableError,
    location_of,
    storage_for,
)
from tests.faults import FailingStorage


def test_atomic_write_reports_size_and_checksum(tmp_path) -> None:
    s = LocalStorage(tmp_path / "d")
    res = s.write_atomic("a.bin", lambda f: f.write(b"hello world"))
    assert res.size == 11
    with s.open_read("a.bin") as f:
        assert checksum_stream(f) == (res.checksum, 11)
    assert os.listdir(tmp_path / "d") == ["a.bin"]


def test_failed_write_leaves_no_file_and_keeps_old(tmp_path) -> None:
    s = FailingStorage(tmp_path, fail_after=3)
    s.write_atomic("a.bin", lambda f: f.write(b"old contents"))
    s.armed = True
    with pytest.raises(OSError) as info:
        s.write_atomic("a.bin", lambda f: f.write(b"new contents that do not fit"))
    assert info.value.errno == errno.ENOSPC
    with s.open_read("a.bin") as f:
        assert f.read() == b"old contents"
    assert sorted(os.listdir(tmp_path)) == ["a.bin"]  # no temporary left behind


def test_cleanup_temporaries_removes_only_temporaries(tmp_path) -> None:
    (tmp_path / f"{TEMP_PREFIX}abc-x.ckpt").write_bytes(b"partial")
    (tmp_path / "x.ckpt").write_bytes(b"complete")
    s = LocalStorage(tmp_path)
    assert s.cleanup_temporaries() == 1
    assert os.listdir(tmp_path) == ["x.ckpt"]


@pytest.mark.parametrize("name", ["", "a/b", "..", "."])
def test_rejects_paths(tmp_path, name) -> None:
    with pytest.raises(ValueError, match="plain file names"):
        LocalStorage(tmp_path).write_atomic(name, lambda f: None)


def test_storage_for_picks_implementation(tmp_path) -> None:
    assert isinstance(storage_for(tmp_path), LocalStorage)
    assert isinstance(storage_for(f"file://{tmp_path}"), LocalStorage)
    local = storage_for(f"local://{tmp_path}")  # fsspec's local backend never fsyncs: ours does
    assert isinstance(local, LocalStorage) and local.fsync and str(local.root) == str(tmp_path)
    assert isinstance(storage_for("memory://autockpt-test"), FsspecStorage)


def test_fsspec_memory_storage_round_trip() -> None:
    s = storage_for("memory://autockpt-test-rt")
    res = s.write_atomic("x.bin", lambda f: f.write(b"abc"))
    assert s.exists("x.bin") and res.size == 3
    with s.open_read("x.bin") as f:
        assert f.read() == b"abc"
    s.delete("x.bin")
    assert not s.exists("x.bin")
    assert s.local_path("x.bin") is None


def test_location_of_is_a_path_locally_and_a_url_elsewhere(tmp_path) -> None:
    assert location_of(LocalStorage(tmp_path), "a.ckpt") == str(tmp_path / "a.ckpt")
    assert location_of(storage_for("memory://bucket/run/"), "a.ckpt") == "memory://bucket/run/a.ckpt"


def _failing_dir_sync(monkeypatch, target: str, code: int) -> None:
    """Make opening (``target="open"``) or fsync'ing (``"fsync"``) a directory fail with ``code``."""
    real_open, real_fsync = os.open, os.fsync
    dir_fds: set[int] = set()

    def fake_open(path, flags, *args, **kwargs):
        if os.path.isdir(path):
            if target == "open":
                raise OSError(code, os.strerror(code))
            fd = real_open(path, flags, *args, **kwargs)
            dir_fds.add(fd)
            return fd
        return real_open(path, flags, *args, **kwargs)

    def fake_fsync(fd):
        if fd in dir_fds:
            raise OSError(code, os.strerror(code))
        return real_fsync(fd)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "fsync", fake_fsync)


@pytest.mark.parametrize(
    "target, code, raises",
    [
        ("fsync", errno.EINVAL, False),  # not supported on this filesystem: durability is its own
        ("fsync", errno.EOPNOTSUPP, False),
        ("open", errno.ENOTSUP, False),
        ("open", errno.EINVAL, False),
        ("fsync", errno.EIO, True),  # a real failure: the rename may not survive a crash
        ("open", errno.EACCES, True),
    ],
)
def test_directory_fsync_ignores_only_not_supported(tmp_path, monkeypatch, target, code, raises) -> None:
    s = LocalStorage(tmp_path)
    _failing_dir_sync(monkeypatch, target, code)
    if not raises:
        assert s.write_atomic("a.bin", lambda f: f.write(b"abc")).size == 3
        return
    with pytest.raises(NotDurableError) as info:
        s.write_atomic("a.bin", lambda f: f.write(b"abc"))
    assert info.value.errno == code and "a.bin is in place" in str(info.value)
    assert (tmp_path / "a.bin").read_bytes() == b"abc"  # renamed: readers see it, durability unknown
