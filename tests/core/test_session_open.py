"""Opening a session: dirpath is probed with a real write at train start; runs get ids, and
retention counts per framework and run (a run never deletes another run's checkpoints)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from autockpt_core import (
    CheckpointSession,
    Config,
    ConfigError,
    Snapshot,
    read_manifest,
)
from autockpt_core.persist.lock import LOCK_NAME
from autockpt_core.run_status import STATUS_NAME
from tests.faults import FailingStorage

COMPAT_KERAS = Path(__file__).parents[1] / "compat" / "data" / "v0.1-flat-core" / "keras"


def make(dirpath: Path | str, framework: str = "np", suffix: str = ".st", **config) -> CheckpointSession:
    cfg = Config(dirpath=str(dirpath), async_persist=False, **config)
    return CheckpointSession(cfg, framework=framework, suffix=suffix)


def save_steps(session: CheckpointSession, *steps: int) -> None:
    for step in steps:
        session.save(step, 0, lambda pool: Snapshot(write=lambda f: f.write(b"state"), nbytes=5))


def _a_file(tmp_path: Path) -> Path:
    (tmp_path / "file").write_text("x")
    return tmp_path / "file"


def _under_a_file(tmp_path: Path) -> Path:
    return _a_file(tmp_path) / "ckpts"


def _read_only(tmp_path: Path) -> Path:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    path = tmp_path / "ro"
    path.mkdir()
    path.chmod(0o500)
    return path / "ckpts"


@pytest.mark.parametrize(
    "where, error, fix",
    [
        (_a_file, "FileExistsError", "dirpath is a file, or lies under one"),
        (_under_a_file, "NotADirectoryError", "dirpath is a file, or lies under one"),
        (_read_only, "PermissionError", "may not write there"),
    ],
)
@pytest.mark.parametrize("begin", ["resume_record", "start"])
def test_an_unwritable_dirpath_fails_when_training_starts(
    tmp_path: Path, where, error: str, fix: str, begin: str
) -> None:
    dirpath = where(tmp_path)
    session = make(dirpath)  # constructing does not touch the directory yet
    with pytest.raises(ConfigError) as info:
        getattr(session, begin)()
    message = str(info.value)
    assert info.value.field == "dirpath" and str(dirpath) in message
    assert error in message and f"Fix: {fix}" in message


def test_the_probe_is_a_real_write_through_the_storage(tmp_path: Path) -> None:
    storage = FailingStorage(tmp_path, fail_after=0)
    storage.armed = True  # every write fails, as on a full disk
    session = CheckpointSession(Config(dirpath=str(tmp_path)), framework="np", suffix=".st", storage=storage)
    with pytest.raises(ConfigError, match="No space left on device") as info:
        session.start(0)
    assert "disk or quota is full" in str(info.value) and storage.failures == 1
    assert os.listdir(tmp_path) == []  # no probe left, and the lock was given back
    storage.armed = False
    session.start(0)
    session.finish()


def test_the_probe_leaves_only_the_lock_file_and_finish_removes_it(tmp_path: Path) -> None:
    session = make(tmp_path / "new" / "dir")
    session.start(0)
    assert os.listdir(tmp_path / "new" / "dir") == [LOCK_NAME]
    session.finish()
    assert os.listdir(tmp_path / "new" / "dir") == [STATUS_NAME]  # "finished", nothing durable


def test_a_fresh_session_starts_a_new_run_and_a_resumed_one_continues_it(tmp_path: Path) -> None:
    first = make(tmp_path, keep_last=2)
    assert first.resume_record() is None
    save_steps(first, 1, 2)
    first.finish()
    assert first.run is not None and len(first.run) == 32
    resumed = make(tmp_path, keep_last=2)
    assert resumed.resume_record().step == 2  # type: ignore[union-attr]
    assert resumed.run == first.run
    save_steps(resumed, 3)
    resumed.finish()
    assert [(r.step, r.run) for r in read_manifest(resumed.storage)] == [(2, first.run), (3, first.run)]
    fresh = make(tmp_path, keep_last=1, resume=False)
    fresh.start(0)
    save_steps(fresh, 1)
    fresh.finish()
    assert fresh.run not in (None, first.run)
    assert [r.step for r in read_manifest(fresh.storage)] == [2, 3, 1]  # the first run's are kept


def test_a_run_of_another_framework_in_the_same_directory_keeps_all_checkpoints(tmp_path: Path) -> None:
    keras = make(tmp_path, framework="keras", suffix=".safetensors", keep_last=3)
    keras.start(0)
    save_steps(keras, 1, 2, 3)
    keras.finish()
    lightning = make(tmp_path, framework="lightning", suffix=".ckpt", keep_last=1)
    assert lightning.resume_record() is None
    save_steps(lightning, 1, 2)
    lightning.finish()
    records = read_manifest(lightning.storage)
    assert [(r.framework, r.step) for r in records] == [("keras", 1), ("keras", 2), ("keras", 3), ("lightning", 2)]
    assert all((tmp_path / r.name).exists() for r in records)


@pytest.mark.parametrize(("resume", "kept"), [(True, [4, 6]), (False, [2, 4, 6])])
def test_records_written_before_run_ids_count_as_the_run_of_a_session_resuming_from_them(
    tmp_path: Path, resume: bool, kept: list[int]
) -> None:
    shutil.copytree(COMPAT_KERAS, tmp_path / "keras")
    session = make(tmp_path / "keras", framework="keras", suffix=".safetensors", keep_last=2, resume=resume)
    record = session.resume_record()
    assert (record.step if record else None) == (4 if resume else None)
    assert (session.run is None) is resume
    save_steps(session, 6)
    session.finish()
    assert [r.step for r in read_manifest(session.storage)] == kept


def test_resume_record_opens_once_and_close_is_idempotent(tmp_path: Path) -> None:
    session = make(tmp_path)
    session.resume_record()
    session.start(0)  # the same session: no conflict with itself
    session.close()
    session.close()
    session.finish()  # after close(): nothing left to release
    assert not (tmp_path / LOCK_NAME).exists()


def test_an_os_error_code_the_fix_does_not_know_still_names_dirpath(tmp_path: Path) -> None:
    storage = FailingStorage(tmp_path, fail_after=0, error=OSError(errno.EIO, "Input/output error"))
    storage.armed = True
    session = CheckpointSession(Config(dirpath=str(tmp_path)), framework="np", suffix=".st", storage=storage)
    with pytest.raises(ConfigError, match="Input/output error") as info:
        session.resume_record()
    assert str(tmp_path) in str(info.value) and "Fix: check free space" in str(info.value)


def test_a_resume_starts_the_persist_process_only_when_training_starts(tmp_path: Path) -> None:
    """The child imports what the training process imports: started while a resume loads its
    checkpoint, it competed with that load for the CPU (0.07 s of a 0.58 s load at 1.3 GB)."""
    from autockpt_core.persist.buffers import BufferPool

    cfg = Config(dirpath=str(tmp_path), async_persist=True, persist_mode="process")
    session = CheckpointSession(cfg, framework="np", suffix=".st", shared_buffers=lambda arena: BufferPool())
    process = session.store._process
    assert process is not None
    try:
        assert session.resume_record() is None
        assert process.pid is None  # the directory is open and locked, the child not started
        session.start(0)
        assert process.pid is not None
    finally:
        session.close()
    session.start(0)  # a session opened again after close() starts a child again
    try:
        assert process.pid is not None and process._proc is not None and process._proc.poll() is None
    finally:
        session.close()
