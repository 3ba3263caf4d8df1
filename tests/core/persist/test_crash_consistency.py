"""Storage errors in the persist: a clear message in the training thread, nothing partial
visible, older checkpoints intact (core level; the Lightning level is in tests/lightning)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import IO, Callable

import pytest

from autockpt_core import (
    MANIFEST_NAME,
    CheckpointWriteError,
    CheckpointWriter,
    LocalStorage,
    PersistJob,
    WriteResult,
    find_latest_valid,
    read_manifest,
)
from tests.faults import FailingStorage


def job(step: int) -> PersistJob:
    return PersistJob(name=f"ckpt-{step}.bin", step=step, epoch=0, framework="t", write=lambda f: f.write(b"s" * 4000))


@pytest.mark.parametrize(
    "error, hint",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "disk or quota is full"),
        (PermissionError(errno.EACCES, "Permission denied"), "may not write there"),
        (OSError(errno.EROFS, "Read-only file system"), "read-only"),
        (OSError(errno.EIO, "Input/output error"), "check free space"),
    ],
)
def test_write_errors_name_the_fix_and_keep_older_checkpoints(tmp_path: Path, error: OSError, hint: str) -> None:
    storage = FailingStorage(tmp_path, fail_after=100, error=error)
    writer = CheckpointWriter(storage, keep_last=1)
    writer.submit(job(1))
    writer.wait()
    storage.armed = True
    writer.submit(job(2))
    with pytest.raises(CheckpointWriteError) as info:
        writer.wait()
    message = str(info.value)
    assert "ckpt-2.bin" in message and "Older checkpoints are untouched" in message and hint in message
    assert info.value.__cause__ is error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autockpt-manifest.json", "ckpt-1.bin"]
    assert find_latest_valid(storage).step == 1  # type: ignore[union-attr]


class ManifestFails(LocalStorage):
    """The checkpoint file is written and renamed, then the manifest write fails."""

    armed = False

    def write_atomic(self, name: str, write: Callable[[IO[bytes]], object]) -> WriteResult:
        if self.armed and name == MANIFEST_NAME:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write_atomic(name, write)


def test_failed_manifest_write_leaves_the_new_file_unlisted_and_the_old_ones_listed(tmp_path: Path) -> None:
    storage = ManifestFails(tmp_path)
    writer = CheckpointWriter(storage, keep_last=1, run_async=False)
    writer.submit(job(1))
    storage.armed = True
    with pytest.raises(CheckpointWriteError, match="disk or quota is full"):
        writer.submit(job(2))
    assert [r.step for r in read_manifest(storage)] == [1]  # not committed, older one not dropped
    assert (tmp_path / "ckpt-1.bin").exists()
    assert find_latest_valid(storage).step == 1  # type: ignore[union-attr]
