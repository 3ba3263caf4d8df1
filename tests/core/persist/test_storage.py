import errno
import os

import pytest

from autockpt_core.persist.checksum import checksum_stream
from autockpt_core.persist.storage import TEMP_PREFIX, FsspecStorage, LocalStorage, location_of, storage_for
from tests.faults import FailingStorage


def test_atomic_write_reports_size_and_checksum(tmp_path) -> None:
    s = LocalStorage(tmp_path / "d")
    res = s.write_atomic("a.bin", lambda f: f.write(b"hello world"))
    assert res.size == 11
    with s.open_read("a.bin") as f:
        assert checksum_stream(f) == (res.checksum, 11)
    assert s.list_names() == ["a.bin"]


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


def test_cleanup_temporaries_and_listing_hides_them(tmp_path) -> None:
    (tmp_path / f"{TEMP_PREFIX}abc-x.ckpt").write_bytes(b"partial")
    s = LocalStorage(tmp_path)
    assert s.list_names() == []
    assert s.cleanup_temporaries() == 1
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["", "a/b", "..", "."])
def test_rejects_paths(tmp_path, name) -> None:
    with pytest.raises(ValueError, match="plain file names"):
        LocalStorage(tmp_path).write_atomic(name, lambda f: None)


def test_storage_for_picks_implementation(tmp_path) -> None:
    assert isinstance(storage_for(tmp_path), LocalStorage)
    assert isinstance(storage_for(f"file://{tmp_path}"), LocalStorage)
    assert isinstance(storage_for("memory://autockpt-test"), FsspecStorage)


def test_fsspec_memory_storage_round_trip() -> None:
    s = storage_for("memory://autockpt-test-rt")
    res = s.write_atomic("x.bin", lambda f: f.write(b"abc"))
    assert s.exists("x.bin") and s.list_names() == ["x.bin"] and res.size == 3
    with s.open_read("x.bin") as f:
        assert f.read() == b"abc"
    s.delete("x.bin")
    assert not s.exists("x.bin")
    assert s.local_path("x.bin") is None


def test_location_of_is_a_path_locally_and_a_url_elsewhere(tmp_path) -> None:
    assert location_of(LocalStorage(tmp_path), "a.ckpt") == str(tmp_path / "a.ckpt")
    assert location_of(storage_for("memory://bucket/run/"), "a.ckpt") == "memory://bucket/run/a.ckpt"
