import pytest

from autockpt_core import LocalStorage, find_latest_valid, read_manifest, verify
from autockpt_core.persist.manifest import MANIFEST_NAME, CheckpointRecord, write_manifest


def _commit(storage, name: str, step: int, payload: bytes, framework: str = "x") -> CheckpointRecord:
    res = storage.write_atomic(name, lambda f: f.write(payload))
    record = CheckpointRecord.from_write(res, step, 0, framework)
    write_manifest(storage, read_manifest(storage) + [record])
    return record


def test_newest_valid_and_fallback_on_corruption(tmp_path) -> None:
    s = LocalStorage(tmp_path)
    _commit(s, "c1", 1, b"a" * 100)
    _commit(s, "c2", 2, b"b" * 100)
    assert find_latest_valid(s).name == "c2"
    # bit flip in the newest
    data = bytearray((tmp_path / "c2").read_bytes())
    data[50] ^= 0x01
    (tmp_path / "c2").write_bytes(bytes(data))
    assert "checksum" in verify(s, read_manifest(s)[-1])
    with pytest.warns(RuntimeWarning, match="skipping checkpoint c2"):
        assert find_latest_valid(s).name == "c1"


def test_truncated_and_missing_files_are_skipped(tmp_path) -> None:
    s = LocalStorage(tmp_path)
    _commit(s, "c1", 1, b"a" * 100)
    _commit(s, "c2", 2, b"b" * 100)
    _commit(s, "c3", 3, b"c" * 100)
    (tmp_path / "c3").write_bytes(b"c" * 40)
    (tmp_path / "c2").unlink()
    with pytest.warns(RuntimeWarning) as warned:
        assert find_latest_valid(s).name == "c1"
    messages = " ".join(str(w.message) for w in warned)
    assert "truncated" in messages and "file missing" in messages


def test_framework_filter_and_empty(tmp_path) -> None:
    s = LocalStorage(tmp_path)
    assert find_latest_valid(s) is None
    _commit(s, "k", 5, b"k", framework="keras")
    assert find_latest_valid(s, framework="lightning") is None
    assert find_latest_valid(s, framework="keras").step == 5


def test_unreadable_manifest_is_an_error_not_empty(tmp_path) -> None:
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        read_manifest(LocalStorage(tmp_path))
