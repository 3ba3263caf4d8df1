"""Multi-file checkpoints (a sharded model's: one file per rank, plus metadata) committed as one
directory under one manifest record: verified file by file, never visible half-written,
retained and cleaned up as whole directories."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Callable

import pytest

from autockpt_core import CheckpointSession, CheckpointWriteError, Config, Snapshot, find_latest_valid, read_manifest
from autockpt_core.persist import CheckpointRecord, LocalStorage, verify
from autockpt_core.persist.file_set import FileSetWrite, commit_file_set, files_digest, new_staging_directory
from autockpt_core.persist.manifest import MANIFEST_NAME
from autockpt_core.persist.storage import TEMP_PREFIX

SHARDS = {"__0_0.distcp": b"rank zero", "__1_0.distcp": b"rank one!!", ".metadata": b"plan", "meta.pt": b"loops"}


def session(tmp_path: Path, **config: object) -> CheckpointSession:
    cfg = Config(dirpath=str(tmp_path), async_persist=False, keep_last=2, **config)  # type: ignore[arg-type]
    return CheckpointSession(cfg, framework="sharded-test", suffix=".ckpt")


def fill_with(files: dict[str, bytes]) -> Callable[[Path], None]:
    def fill(path: Path) -> None:
        for name, data in files.items():
            (path / name).write_bytes(data)

    return fill


def save_file_set(s: CheckpointSession, step: int, fill: Callable[[Path], None]) -> None:
    staging = s.staging_directory()

    def snapshot(pool: object) -> Snapshot:
        return Snapshot(write=lambda f: None, nbytes=0, file_set=FileSetWrite(staging, fill))

    s.save(step, 0, snapshot)


def test_a_committed_file_set_lists_every_file_and_verifies_each(tmp_path: Path) -> None:
    s = session(tmp_path)
    s.start(0)
    save_file_set(s, 3, fill_with(SHARDS))
    s.finish()
    (record,) = read_manifest(LocalStorage(tmp_path))
    assert record.name == "ckpt-step000000003.ckpt" and (tmp_path / record.name).is_dir()
    assert sorted(record.files or {}) == sorted(SHARDS)
    assert record.files["__1_0.distcp"][0] == len(SHARDS["__1_0.distcp"])  # type: ignore[index]
    assert record.size == sum(len(v) for v in SHARDS.values())
    assert record.checksum == files_digest(record.files or {})
    assert verify(LocalStorage(tmp_path), record) is None
    assert not list(tmp_path.glob(f"{TEMP_PREFIX}*"))  # the staging directory became the checkpoint


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda d: (d / "__1_0.distcp").unlink(), "file __1_0.distcp missing"),
        (lambda d: (d / "__0_0.distcp").write_bytes(b"rank zer"), "__0_0.distcp: size 8 != 9"),
        (lambda d: (d / "meta.pt").write_bytes(b"LOOPS"), "meta.pt: checksum"),
        (lambda d: [p.unlink() for p in d.iterdir()] and d.rmdir(), "directory missing"),
    ],
)
def test_a_damaged_shard_makes_the_resume_fall_back_to_the_previous_checkpoint(
    tmp_path: Path, damage: Callable[[Path], object], reason: str
) -> None:
    s = session(tmp_path)
    s.start(0)
    save_file_set(s, 2, fill_with(SHARDS))
    save_file_set(s, 4, fill_with(SHARDS))
    s.finish()
    newest = read_manifest(LocalStorage(tmp_path))[-1]
    damage(tmp_path / newest.name)
    assert reason in (verify(LocalStorage(tmp_path), newest) or "")
    with pytest.warns(RuntimeWarning, match="skipping checkpoint ckpt-step000000004.ckpt"):
        found = find_latest_valid(LocalStorage(tmp_path))
    assert found is not None and found.step == 2


def test_a_failing_fill_leaves_no_directory_and_the_previous_checkpoint_newest(tmp_path: Path) -> None:
    """A rank's save failed (DCP raised in the fill): nothing of the new checkpoint stays, the
    error is raised in the training thread, the older checkpoint stays listed and valid."""
    s = session(tmp_path)
    s.start(0)
    save_file_set(s, 2, fill_with(SHARDS))

    def failing(path: Path) -> None:
        (path / "__0_0.distcp").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointWriteError, match="No space left on device"):
        save_file_set(s, 4, failing)
    s.close()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".autockpt-lock")) == [
        MANIFEST_NAME,
        "autockpt-status.json",
        "ckpt-step000000002.ckpt",
    ]
    assert [r.step for r in read_manifest(LocalStorage(tmp_path))] == [2]


def test_retention_deletes_whole_directories_only_after_the_new_one_is_committed(tmp_path: Path) -> None:
    s = session(tmp_path)  # keep_last=2
    s.start(0)
    for step in (2, 4, 6):
        save_file_set(s, step, fill_with(SHARDS))
    s.finish()
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-"))
    assert names == ["ckpt-step000000004.ckpt", "ckpt-step000000006.ckpt"]
    assert [r.step for r in read_manifest(LocalStorage(tmp_path))] == [4, 6]


def test_a_resume_removes_staging_and_unlisted_checkpoint_directories(tmp_path: Path) -> None:
    """What a job killed mid-checkpoint leaves: a staging directory with some ranks' shards
    (killed before the rename) and a complete directory the manifest never listed (killed
    between the rename and the manifest write)."""
    s = session(tmp_path)
    s.start(0)
    save_file_set(s, 2, fill_with(SHARDS))
    s.finish()
    staging = new_staging_directory(LocalStorage(tmp_path))
    (staging / "__1_0.distcp").write_bytes(b"half")
    orphan = tmp_path / "ckpt-step000000004.ckpt"
    orphan.mkdir()
    (orphan / "__0_0.distcp").write_bytes(b"whole")
    resumed = session(tmp_path)
    record = resumed.resume_record()
    resumed.close()
    assert record is not None and record.step == 2
    assert not staging.exists() and not orphan.exists()
    assert (tmp_path / "ckpt-step000000002.ckpt" / "meta.pt").read_bytes() == b"loops"


def test_an_existing_name_is_never_written_over(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    (tmp_path / "ckpt-step000000002.ckpt").mkdir()
    staging = new_staging_directory(storage)
    with pytest.raises(FileExistsError):
        commit_file_set(storage, FileSetWrite(staging, fill_with(SHARDS)), "ckpt-step000000002.ckpt")
    assert not staging.exists() and not list((tmp_path / "ckpt-step000000002.ckpt").iterdir())


def test_the_session_gives_a_taken_step_name_a_new_version(tmp_path: Path) -> None:
    """A directory left by an earlier run (resume=False) under the name keeps it; the new one is -v2."""
    (tmp_path / "ckpt-step000000002.ckpt").mkdir()
    s = session(tmp_path, resume=False)
    s.start(0)
    save_file_set(s, 2, fill_with(SHARDS))
    s.finish()
    assert [r.name for r in read_manifest(LocalStorage(tmp_path))] == ["ckpt-step000000002-v2.ckpt"]


def test_single_file_records_keep_their_json_and_file_sets_round_trip(tmp_path: Path) -> None:
    s = session(tmp_path)
    s.start(0)
    s.save(1, 0, lambda pool: Snapshot(write=lambda f: f.write(b"state"), nbytes=5))
    save_file_set(s, 2, fill_with(SHARDS))
    s.finish()
    entries = json.loads((tmp_path / MANIFEST_NAME).read_text())["checkpoints"]
    assert "files" not in entries[0]  # what older autockpt versions read is unchanged
    assert sorted(entries[1]["files"]) == sorted(SHARDS)
    assert read_manifest(LocalStorage(tmp_path))[1].files == entries[1]["files"]


def test_remote_storage_takes_no_file_sets(tmp_path: Path) -> None:
    s = CheckpointSession(Config(dirpath="memory://autockpt-file-set-test"), framework="t", suffix=".ckpt")
    with pytest.raises(ValueError, match="multi-file checkpoints need a local directory"):
        s.staging_directory()
    s.close()


def test_file_set_files_are_fsynced_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file and directory of the set is fsync'ed before the rename (and dirpath after)."""
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    storage = LocalStorage(tmp_path)
    staging = new_staging_directory(storage)
    commit_file_set(storage, FileSetWrite(staging, fill_with(SHARDS)), "ckpt-step000000001.ckpt")
    assert len(synced) >= len(SHARDS) + 2  # the files, the directory, dirpath


def test_checksums_the_writers_computed_are_taken_and_only_other_files_are_read(tmp_path: Path) -> None:
    """Each rank checksums its own files: the commit takes those entries (a size that does not
    match the file on disk is not trusted: that file is read), and reads the rest."""
    storage = LocalStorage(tmp_path)
    staging = new_staging_directory(storage)

    def fill(path: Path) -> dict[str, list[object]]:
        fill_with(SHARDS)(path)
        return {
            "__0_0.distcp": [len(SHARDS["__0_0.distcp"]), "0badc0de"],  # taken as given: not read
            "__1_0.distcp": [1, "0badc0de"],  # wrong size: read and checksummed here
        }

    result = commit_file_set(storage, FileSetWrite(staging, fill), "ckpt-step000000001.ckpt")
    files = result.files or {}
    assert files["__0_0.distcp"] == [9, "0badc0de"]
    assert files["__1_0.distcp"][1] != "0badc0de" and files["__1_0.distcp"][0] == 10
    fresh = {name: entry for name, entry in files.items() if name != "__0_0.distcp"}
    assert verify(storage, dataclasses.replace(record_of(result), files=fresh)) is None


def record_of(result: object) -> CheckpointRecord:
    return CheckpointRecord.from_write(result, step=1, epoch=0, framework="t")  # type: ignore[arg-type]
