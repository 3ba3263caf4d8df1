"""The mirror (``autockpt_core.persist.mirror``): uploads in the background, newest first, with
its own retention; its failures reach the training thread and leave both tiers intact."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import IO, Any, Callable

import pytest

from autockpt_core.errors import CheckpointWriteError
from autockpt_core.persist import LocalStorage, WriteResult, read_manifest
from autockpt_core.persist.manifest import write_manifest
from autockpt_core.persist.mirror import Mirror
from tests.core.persist.committing import commit


class GatedStorage(LocalStorage):
    """A mirror whose uploads wait for ``gate`` (set: they pass) and may fail with ``error``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.uploads: list[str] = []

    def write_atomic(self, name: str, write: Callable[[IO[bytes]], object]) -> WriteResult:
        if name.startswith("ckpt-"):
            self.started.set()
            self.gate.wait(10)
            if self.error is not None:
                raise self.error
            self.uploads.append(name)
        return super().write_atomic(name, write)


@pytest.fixture()
def fast(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path / "fast")


@pytest.fixture()
def remote(tmp_path: Path) -> GatedStorage:
    return GatedStorage(tmp_path / "mirror")


def test_each_committed_checkpoint_is_uploaded_and_listed_with_its_own_retention(
    fast: LocalStorage, remote: GatedStorage
) -> None:
    mirror = Mirror(fast, remote, keep_last=2)
    for step in (1, 2, 3):
        mirror.submit(commit(fast, step))
        mirror.wait()
    assert [r.step for r in read_manifest(remote)] == [2, 3]
    assert sorted(p.name for p in remote.root.iterdir() if p.name.startswith("ckpt-")) == [
        "ckpt-step000000002.bin", "ckpt-step000000003.bin"
    ]  # fmt: skip
    assert [r.step for r in read_manifest(fast)] == [1, 2, 3]  # the fast tier's retention is the writer's
    assert mirror.mirrored == 3 and mirror.superseded == 0 and mirror.last_record is not None
    assert mirror.last_record.step == 3 and mirror.last_upload_s is not None and not mirror.busy


def test_a_slow_mirror_uploads_the_newest_next_and_skips_the_ones_between(
    fast: LocalStorage, remote: GatedStorage
) -> None:
    mirror = Mirror(fast, remote, keep_last=5)
    remote.gate.clear()
    mirror.submit(commit(fast, 1))
    assert remote.started.wait(10)  # step 1's upload is under way and held
    for step in (2, 3, 4):
        mirror.submit(commit(fast, step))
    assert mirror.busy and not mirror.wait(timeout=0.05)
    remote.gate.set()
    mirror.wait()
    assert remote.uploads == ["ckpt-step000000001.bin", "ckpt-step000000004.bin"]
    assert [r.step for r in read_manifest(remote)] == [1, 4]
    assert (mirror.mirrored, mirror.superseded) == (2, 2)


def test_a_failed_upload_is_raised_in_the_training_thread_and_both_tiers_keep_their_checkpoints(
    fast: LocalStorage, remote: GatedStorage
) -> None:
    mirror = Mirror(fast, remote, keep_last=5)
    mirror.submit(commit(fast, 1))
    mirror.wait()
    remote.error = OSError(errno.ENOSPC, "No space left on device")
    mirror.submit(commit(fast, 2))
    with pytest.raises(CheckpointWriteError) as info:
        mirror.wait()
    message = str(info.value)
    assert "could not mirror checkpoint ckpt-step000000002.bin (step 2)" in message
    assert f"committed in {fast.location}" in message and "still step 1" in message
    assert "No space left on device" in message and isinstance(info.value.__cause__, OSError)
    mirror.raise_if_failed()  # raised once
    assert [r.step for r in read_manifest(remote)] == [1] and [r.step for r in read_manifest(fast)] == [1, 2]
    remote.error = None  # the next checkpoint is mirrored again
    mirror.submit(commit(fast, 3))
    mirror.wait()
    assert [r.step for r in read_manifest(remote)] == [1, 3]


def test_a_file_retention_removed_before_its_upload_is_skipped_but_a_listed_missing_file_is_an_error(
    fast: LocalStorage, remote: GatedStorage
) -> None:
    mirror = Mirror(fast, remote, keep_last=5)
    dropped = commit(fast, 1)
    kept = commit(fast, 2)
    write_manifest(fast, [kept])  # what retention does: unlist, then delete
    fast.delete(dropped.name)
    mirror.submit(dropped)
    mirror.wait()
    assert (mirror.mirrored, mirror.superseded) == (0, 1) and read_manifest(remote) == []
    fast.delete(kept.name)  # listed, but gone: something else removed it
    mirror.submit(kept)
    with pytest.raises(CheckpointWriteError, match="FileNotFoundError"):
        mirror.wait()


def test_retention_problems_in_the_mirror_are_warnings(fast: LocalStorage, remote: GatedStorage) -> None:
    class Undeletable(GatedStorage):
        def delete(self, name: str) -> None:
            if name.startswith("ckpt-"):
                raise PermissionError(errno.EACCES, "read-only bucket policy")
            super().delete(name)

    target = Undeletable(remote.root.parent / "undeletable")
    mirror = Mirror(fast, target, keep_last=1)
    mirror.submit(commit(fast, 1))
    mirror.wait()
    mirror.submit(commit(fast, 2))
    with pytest.warns(RuntimeWarning, match="could not delete the older checkpoint .*step000000001"):
        mirror.wait()
    assert [r.step for r in read_manifest(target)] == [2]


def test_keep_last_is_checked() -> None:
    with pytest.raises(ValueError, match="keep_last"):
        Mirror(Any, Any, keep_last=0)  # type: ignore[arg-type]
