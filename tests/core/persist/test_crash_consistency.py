"""Storage errors in the persist: a clear message in the training thread, nothing partial
visible, older checkpoints intact (core level; the Lightning level is in tests/lightning)."""

from __future__ import annotations

import errno
import warnings
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
from autockpt_core.persist.storage import NotDurableError
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


class StageStorage(LocalStorage):
    """LocalStorage that, once armed, fails the stages named in ``fail``.

    Stages: ``checkpoint`` (ENOSPC half-way through the file), ``commit`` (the first manifest
    write of a persist), ``retention`` (the second: dropping old records); ``<stage>-durable``:
    that write succeeds, then the directory fsync fails; ``delete-new`` / ``delete-old``:
    removing the new file / an old one fails.
    """

    def __init__(self, root: Path, fail: set[str]) -> None:
        super().__init__(root)
        self.fail, self.armed, self.manifest_writes = fail, False, 0

    def write_atomic(self, name: str, write: Callable[[IO[bytes]], object]) -> WriteResult:
        if not self.armed:
            return super().write_atomic(name, write)
        if name == MANIFEST_NAME:
            self.manifest_writes += 1
            stage = "commit" if self.manifest_writes == 1 else "retention"
        else:
            stage = "checkpoint"
        if stage in self.fail:

            def half_then_fail(f: IO[bytes]) -> None:
                f.write(b"half")
                raise OSError(errno.ENOSPC, "No space left on device")

            return super().write_atomic(name, half_then_fail)
        result = super().write_atomic(name, write)
        if f"{stage}-durable" in self.fail:
            raise NotDurableError(errno.EIO, f"{name} is in place, but fsync of the directory failed")
        return result

    def delete(self, name: str) -> None:
        if self.armed and (("delete-new" if name == "ckpt-2.bin" else "delete-old") in self.fail):
            raise PermissionError(errno.EACCES, "Permission denied")
        super().delete(name)


STAGES = [
    # fail, error message parts (None: no error), warning part, steps listed, files on disk
    ({"checkpoint"}, ["could not persist", "Nothing of it is left on disk"], None, [1], ["ckpt-1.bin"]),
    ({"checkpoint-durable"}, ["could not persist", "Nothing of it is left on disk"], None, [1], ["ckpt-1.bin"]),
    (
        {"checkpoint-durable", "delete-new"},
        ["could not persist", "Removing the unlisted file failed too", "delete {dir}/ckpt-2.bin by hand"],
        None, [1], ["ckpt-1.bin", "ckpt-2.bin"],
    ),
    ({"commit"}, ["could not list it in the manifest", "The unlisted file was removed"], None, [1], ["ckpt-1.bin"]),
    (
        {"commit", "delete-new"},
        ["could not list it in the manifest", "Removing the unlisted file failed too", "{dir}/ckpt-2.bin"],
        None, [1], ["ckpt-1.bin", "ckpt-2.bin"],
    ),
    (
        {"commit-durable"},
        ["listed checkpoint ckpt-2.bin", "could not make the manifest durable", "usable now"],
        None, [1, 2], ["ckpt-1.bin", "ckpt-2.bin"],
    ),
    ({"retention"}, None, "retention could not update the manifest", [1, 2], ["ckpt-1.bin", "ckpt-2.bin"]),
    ({"retention-durable"}, None, "could not make it durable", [2], ["ckpt-1.bin", "ckpt-2.bin"]),
    ({"delete-old"}, None, "could not delete the older checkpoint {dir}/ckpt-1.bin", [2], ["ckpt-1.bin", "ckpt-2.bin"]),
]  # fmt: skip


@pytest.mark.parametrize("fail, error_parts, warning_part, listed, files", STAGES)
def test_each_failure_stage_says_what_it_left_and_keeps_older_checkpoints(
    tmp_path: Path,
    fail: set[str],
    error_parts: list[str] | None,
    warning_part: str | None,
    listed: list[int],
    files: list[str],
) -> None:
    storage = StageStorage(tmp_path, fail)
    writer = CheckpointWriter(storage, keep_last=1, run_async=False)
    writer.submit(job(1))
    storage.armed = True
    if error_parts is not None:
        with pytest.raises(CheckpointWriteError) as info:
            writer.submit(job(2))
        message = str(info.value)
        for part in error_parts + ["Older checkpoints are untouched", "Fix: "]:
            assert part.format(dir=tmp_path) in message
        assert "no partial file" not in message
    else:
        with pytest.warns(RuntimeWarning, match="committed") as warned:
            writer.submit(job(2))  # not an error: the new checkpoint is committed
        assert warning_part is not None and warning_part.format(dir=tmp_path) in str(warned[0].message)
    storage.armed = False
    assert [r.step for r in read_manifest(storage)] == listed
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["autockpt-manifest.json", *files])
    assert find_latest_valid(storage).step == listed[-1]  # type: ignore[union-attr]


def test_a_retention_warning_from_the_writer_thread_is_issued_in_the_training_thread(tmp_path: Path) -> None:
    storage = StageStorage(tmp_path, {"delete-old"})
    writer = CheckpointWriter(storage, keep_last=1)
    writer.submit(job(1))
    writer.wait()
    storage.armed = True
    writer.submit(job(2))
    with pytest.warns(RuntimeWarning, match="ckpt-1.bin"):
        writer.wait()
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        writer.wait()
    assert again == []  # issued once
    assert writer.committed == 2 and [r.step for r in read_manifest(storage)] == [2]
