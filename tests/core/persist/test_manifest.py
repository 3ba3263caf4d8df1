import dataclasses
import json

import hypothesis.strategies as st
import pytest
from hypothesis import given

from autockpt_core import LocalStorage, find_latest_valid, read_manifest, verify
from autockpt_core.persist.manifest import (
    MANIFEST_NAME,
    CheckpointRecord,
    commit_order,
    next_seq,
    write_manifest,
)


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


def _writes(payload: bytes):
    return lambda f: f.write(payload)


def _legacy_manifest(tmp_path, entries: list[tuple[str, int, float]]) -> LocalStorage:
    """A version 1 manifest (no seq, no run) listing files ``(name, step, created)``."""
    s = LocalStorage(tmp_path)
    records = []
    for name, step, created in entries:
        res = s.write_atomic(name, _writes(name.encode()))
        data = CheckpointRecord.from_write(res, step, 0, "x", created=created).to_json()
        del data["seq"], data["run"]
        records.append(data)
    body = {"format": "autockpt-manifest", "version": 1, "checkpoints": records}
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(body))
    return s


def test_version_1_records_are_numbered_in_their_created_then_step_order(tmp_path) -> None:
    s = _legacy_manifest(tmp_path, [("b", 7, 20.0), ("a", 9, 10.0), ("c", 3, 20.0)])
    records = read_manifest(s)
    assert [(r.name, r.seq, r.run) for r in records] == [("a", 1, None), ("c", 2, None), ("b", 3, None)]
    assert find_latest_valid(s).name == "b"
    write_manifest(s, records)  # written back as version 2, same order
    assert json.loads((tmp_path / MANIFEST_NAME).read_text())["version"] == 2
    assert [(r.name, r.seq) for r in read_manifest(s)] == [("a", 1), ("c", 2), ("b", 3)]


@given(created=st.lists(st.floats(min_value=0, max_value=2e9, allow_nan=False), min_size=1, max_size=8))
def test_commit_order_follows_seq_whatever_the_clocks_say(created: list[float]) -> None:
    records = [
        CheckpointRecord(f"c{i}", step=100 - i, epoch=0, created=t, size=1, checksum="0", algorithm="crc32",
                         framework="x", seq=i + 1)
        for i, t in enumerate(created)
    ]  # fmt: skip
    shuffled = list(reversed(records))
    assert sorted(shuffled, key=commit_order) == records
    assert next_seq(shuffled) == len(records) + 1


def test_write_manifest_numbers_records_without_seq_after_the_others(tmp_path) -> None:
    s = LocalStorage(tmp_path)
    first = _commit(s, "c1", 1, b"a")
    write_manifest(s, read_manifest(s) + [dataclasses.replace(first, name="c2", created=0.0, seq=0)])
    assert [(r.name, r.seq) for r in read_manifest(s)] == [("c1", 1), ("c2", 2)]


@pytest.mark.parametrize(
    "body, problem",
    [
        ("[]", "expected a JSON object, found list"),
        ("null", "expected a JSON object, found NoneType"),
        ('"text"', "expected a JSON object, found str"),
        ('{"format": "other", "checkpoints": []}', "not an autockpt manifest"),
        ('{"format": "autockpt-manifest"}', "'checkpoints' is NoneType, not a list"),
        ('{"format": "autockpt-manifest", "checkpoints": null}', "'checkpoints' is NoneType, not a list"),
        ('{"format": "autockpt-manifest", "checkpoints": {}}', "'checkpoints' is dict, not a list"),
        ('{"format": "autockpt-manifest", "checkpoints": "ab"}', "'checkpoints' is str, not a list"),
        ('{"format": "autockpt-manifest", "checkpoints": [1]}', "checkpoint entry 0 is int, not an object"),
        ('{"format": "autockpt-manifest", "checkpoints": [{"name": "a"}]}', "missing"),
        ("\xff", "cannot read"),
    ],
)
def test_manifests_of_the_wrong_shape_are_a_clear_value_error(tmp_path, body: str, problem: str) -> None:
    (tmp_path / MANIFEST_NAME).write_bytes(body.encode("latin-1"))
    with pytest.raises(ValueError, match="cannot read autockpt-manifest.json") as info:
        read_manifest(LocalStorage(tmp_path))
    assert problem in str(info.value)


@pytest.mark.parametrize("seq", ["1", -1, 1.5, True])
def test_a_record_with_a_bad_seq_is_a_clear_value_error(tmp_path, seq) -> None:
    s = LocalStorage(tmp_path)
    record = _commit(s, "c1", 1, b"a").to_json()
    record["seq"] = seq
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"format": "autockpt-manifest", "checkpoints": [record]}))
    with pytest.raises(ValueError, match="seq="):
        read_manifest(s)
