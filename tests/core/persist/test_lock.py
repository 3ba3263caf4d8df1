"""One writer per directory: a second session fails at start and names the holder; a dead
holder (SIGKILL) leaves no stale lock, not even through a forked child that outlives it."""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import os
import socket
from pathlib import Path

import pytest

from autockpt_core import (
    CheckpointSession,
    CheckpointWriteError,
    Config,
    DirectoryLockedError,
    Snapshot,
)
from autockpt_core.persist.lock import LOCK_NAME, DirectoryLock, Holder


def session(tmp_path: Path, **config) -> CheckpointSession:
    return CheckpointSession(Config(dirpath=str(tmp_path), **config), framework="np", suffix=".st")


def test_a_second_process_fails_at_start_naming_the_holder_and_the_fix(tmp_path, holding) -> None:
    holder = holding()
    for begin in ("resume_record", "start"):
        with pytest.raises(DirectoryLockedError) as info:
            getattr(session(tmp_path), begin)()
        message = str(info.value)
        assert f"pid {holder.proc.pid}" in message and socket.gethostname() in message
        assert "'other-fw'" in message and str(tmp_path) in message
        assert "wait for that run to end" in message and "another dirpath" in message
        assert info.value.holder is not None and info.value.holder["pid"] == holder.proc.pid
    holder.tell("finish")
    assert holder.readline() == "RELEASED"
    assert not (tmp_path / LOCK_NAME).exists()  # a released lock removes its file
    s = session(tmp_path)
    s.start(0)
    s.finish()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path, holding) -> None:
    holder = holding()
    with pytest.raises(DirectoryLockedError):
        session(tmp_path).start(0)
    holder.kill()  # SIGKILL: no finally block, no atexit
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == holder.proc.pid  # its file stays ...
    s = session(tmp_path)
    s.start(0)  # ... but not its lock
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    s.finish()


def test_a_forked_child_that_outlives_its_killed_parent_does_not_keep_the_lock(tmp_path, holding) -> None:
    holder = holding("fork")
    assert holder.child is not None
    holder.kill()
    os.kill(holder.child, 0)  # the child still runs
    s = session(tmp_path)
    s.start(0)
    s.finish()


def test_a_second_session_in_the_same_process_fails_until_the_first_is_finished(tmp_path) -> None:
    first = session(tmp_path)
    first.start(0)
    with pytest.raises(DirectoryLockedError, match="another CheckpointSession in this process") as info:
        session(tmp_path).resume_record()
    assert "call finish() (or close())" in str(info.value) and "'np'" in str(info.value)
    first.finish()
    second = session(tmp_path)
    second.start(0)
    second.close()
    second.close()  # idempotent


def test_an_unreachable_unfinished_session_releases_its_lock_when_collected(tmp_path) -> None:
    session(tmp_path).start(0)  # never finished, no reference kept (a cycle: freed by gc only)
    s = session(tmp_path)
    s.start(0)
    s.finish()
    gc.collect()


def test_finish_releases_the_lock_even_when_it_raises(tmp_path) -> None:
    def no_space(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    s = session(tmp_path)
    s.start(0)
    s.save(1, 0, lambda pool: Snapshot(write=no_space, nbytes=1))
    with pytest.raises(CheckpointWriteError, match="No space left"):
        s.finish()
    again = session(tmp_path)
    again.start(0)  # the lock was released although finish() raised
    again.finish()


def test_remote_storage_has_no_lock() -> None:
    cfg = Config(dirpath="memory://autockpt-test-no-lock")
    a = CheckpointSession(cfg, framework="np", suffix=".st")
    b = CheckpointSession(cfg, framework="np", suffix=".st")
    a.start(0)
    b.start(0)  # documented limitation: no lock on fsspec storage
    a.finish()
    b.finish()


def test_a_filesystem_without_flock_warns_and_runs_unlocked(tmp_path, monkeypatch) -> None:
    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.warns(RuntimeWarning, match="does not support file locks"):
        lock = DirectoryLock.acquire(tmp_path, Holder.current("np"))
    assert lock is None


def test_the_lock_file_names_its_holder(tmp_path) -> None:
    lock = DirectoryLock.acquire(tmp_path / "new", Holder("node-7", 1234, "keras", 0.0))
    assert lock is not None and lock.held
    assert json.loads((tmp_path / "new" / LOCK_NAME).read_text()) == {
        "host": "node-7", "pid": 1234, "framework": "keras", "started": 0.0,
    }  # fmt: skip
    lock.release()
    lock.release()
    assert not lock.held and not (tmp_path / "new" / LOCK_NAME).exists()


def test_removing_the_lock_file_of_a_held_lock_does_not_let_a_second_writer_in(tmp_path, holding) -> None:
    holder = holding()
    (tmp_path / LOCK_NAME).unlink()  # the lock is the directory's, not the file's
    with pytest.raises(DirectoryLockedError, match="another session is writing checkpoints"):
        session(tmp_path).start(0)
    holder.tell("finish")
    assert holder.readline() == "RELEASED"
    s = session(tmp_path)
    s.start(0)
    s.finish()


def test_a_planted_symlink_is_refused_and_its_target_is_not_overwritten(tmp_path) -> None:
    from autockpt_core import ConfigError

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    dirpath = tmp_path / "ckpts"
    dirpath.mkdir()
    (dirpath / LOCK_NAME).symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        session(dirpath).start(0)
    assert victim.read_text() == "precious"
