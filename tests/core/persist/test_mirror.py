"""The mirror (``autockpt_core.persist.mirror``): uploads in the background, newest first, with
its own retention; its failures reach the training thread and leave both tiers intact."""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable

import pytest

from autockpt_core.errors import CheckpointWriteError, MirrorWriteError
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
        self.fail_next = 0  # this many uploads fail with `error` (then error is cleared), if > 0
        self.attempts = 0
        self.uploads: list[str] = []

    def write_atomic(self, name: str, write: Callable[[IO[bytes]], object]) -> WriteResult:
        if name.startswith("ckpt-"):
            self.started.set()
            self.gate.wait(10)
            self.attempts += 1
            if self.error is not None:
                if self.fail_next:
                    self.fail_next -= 1
                    error = self.error
                    if not self.fail_next:
                        self.error = None
                    raise error
                raise self.error
            self.uploads.append(name)
        return super().write_atomic(name, write)


def mirror_holding_step_1(fast: LocalStorage, remote: GatedStorage) -> Mirror:
    """A mirror whose upload of step 1 is under way and held at ``remote.gate``."""
    mirror = Mirror(fast, remote, keep_last=5)
    remote.gate.clear()
    mirror.submit(commit(fast, 1))
    assert remote.started.wait(10)
    return mirror


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
    mirror = mirror_holding_step_1(fast, remote)
    for step in (2, 3, 4):
        mirror.submit(commit(fast, step))
    assert mirror.busy and not mirror.wait(timeout=0.05)
    remote.gate.set()
    mirror.wait()
    assert remote.uploads == ["ckpt-step000000001.bin", "ckpt-step000000004.bin"]
    assert [r.step for r in read_manifest(remote)] == [1, 4]
    assert (mirror.mirrored, mirror.superseded) == (2, 2)


def test_retention_keeps_the_upload_in_flight_and_the_newest_waiting_and_nothing_else(
    fast: LocalStorage, remote: GatedStorage
) -> None:
    mirror = Mirror(fast, remote, keep_last=5)
    assert mirror.protected() == set()
    one = commit(fast, 1)
    remote.gate.clear()
    mirror.submit(one)
    assert remote.started.wait(10) and mirror.protected() == {one.name}
    waiting = [commit(fast, step) for step in (2, 3)]
    for record in waiting:
        mirror.submit(record)
    assert mirror.protected() == {one.name, waiting[-1].name}  # step 2 was replaced: no longer needed
    remote.gate.set()
    mirror.wait()
    assert mirror.protected() == set()
    assert [r.step for r in read_manifest(remote)] == [1, 3]


def test_a_failed_upload_is_raised_in_the_training_thread_and_both_tiers_keep_their_checkpoints(
    fast: LocalStorage, remote: GatedStorage
) -> None:
    mirror = Mirror(fast, remote, keep_last=5, max_failures=1)
    mirror.submit(commit(fast, 1))
    mirror.wait()
    remote.error = OSError(errno.ENOSPC, "No space left on device")
    mirror.submit(commit(fast, 2))
    with pytest.raises(MirrorWriteError) as info:
        mirror.wait()
    message = str(info.value)
    assert "could not mirror checkpoint ckpt-step000000002.bin (step 2)" in message
    assert "1 failed upload(s) in a row" in message
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
    mirror = Mirror(fast, remote, keep_last=5, max_failures=1)
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


def test_a_transient_failure_is_a_warning_and_the_upload_is_tried_again(fast: LocalStorage, remote: GatedStorage) -> None:
    mirror = Mirror(fast, remote, keep_last=5, max_failures=3, retry_first_s=0.01)
    remote.error, remote.fail_next = OSError(errno.EIO, "503 Slow Down"), 2
    mirror.submit(commit(fast, 1))
    with pytest.warns(RuntimeWarning) as caught:
        mirror.wait()  # no error: the third attempt went through
    texts = [str(w.message) for w in caught]
    assert len(texts) == 2 and "upload 1 of ckpt-step000000001.bin" in texts[0] and "upload 2 of" in texts[1]
    assert "503 Slow Down" in texts[0] and "trying again in 0.01s" in texts[0] and "0.02s" in texts[1]
    assert f"committed in {fast.location}" in texts[0] and "after 3 failures in a row" in texts[0]
    assert [r.step for r in read_manifest(remote)] == [1] and remote.attempts == 3
    assert (mirror.mirrored, mirror.failed_uploads) == (1, 2)


def test_failures_in_a_row_up_to_mirror_max_failures_stop_training(fast: LocalStorage, remote: GatedStorage) -> None:
    mirror = Mirror(fast, remote, keep_last=5, max_failures=3, retry_first_s=0.01)
    remote.error = OSError(errno.EACCES, "ExpiredToken")
    mirror.submit(commit(fast, 1))
    with pytest.warns(RuntimeWarning), pytest.raises(MirrorWriteError, match="3 failed upload.* in a row.*ExpiredToken"):
        mirror.wait()
    assert remote.attempts == 3 and read_manifest(remote) == [] and [r.step for r in read_manifest(fast)] == [1]


def test_a_failure_after_mirror_max_outage_without_success_stops_training(fast: LocalStorage, remote: GatedStorage) -> None:
    now = [0.0]
    mirror = Mirror(fast, remote, keep_last=5, max_failures=100, max_outage=600.0, clock=lambda: now[0])
    mirror.submit(commit(fast, 1))
    mirror.wait()  # the last success: t = 0
    remote.error = OSError(errno.ECONNREFUSED, "connection refused")
    now[0] = 599.0
    mirror.retry_first_s = 0.01
    mirror.submit(commit(fast, 2))
    with pytest.warns(RuntimeWarning, match="upload 1 of ckpt-step000000002.bin"):
        deadline = time.monotonic() + 10
        while mirror.failed_uploads < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        now[0] = 601.0  # the outage is longer than max_outage at the next failure
        with pytest.raises(MirrorWriteError, match="no successful upload for 601s"):
            mirror.wait()
    assert [r.step for r in read_manifest(remote)] == [1]


def test_deliver_abandons_an_older_upload_in_flight_so_the_newest_goes_first(
    fast: LocalStorage, remote: GatedStorage
) -> None:
    mirror = mirror_holding_step_1(fast, remote)
    newest = commit(fast, 2)
    mirror.submit(newest)
    threading.Timer(0.2, remote.gate.set).start()  # step 1's upload goes on, and is abandoned at its first block
    delivery = mirror.deliver(newest, timeout=10)
    assert delivery.uploaded and delivery.problem is None
    assert [r.step for r in read_manifest(remote)] == [2]
    assert sorted(p.name for p in remote.root.iterdir() if p.name.startswith(("ckpt-", ".autockpt-tmp"))) == [
        "ckpt-step000000002.bin"
    ]


def test_deliver_gives_up_after_its_timeout_and_never_raises(fast: LocalStorage, remote: GatedStorage) -> None:
    mirror = Mirror(fast, remote, keep_last=5, max_failures=5, retry_first_s=0.01)
    remote.gate.clear()
    record = commit(fast, 1)
    mirror.submit(record)
    start = time.monotonic()
    delivery = mirror.deliver(record, timeout=0.3)
    assert not delivery.uploaded and "did not finish within 0.3s and was abandoned" in (delivery.problem or "")
    assert time.monotonic() - start < 5
    remote.gate.set()  # the held upload resumes, sees it was abandoned and lists nothing
    deadline = time.monotonic() + 10
    while mirror.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read_manifest(remote) == [] and not any(p.name.startswith("ckpt-") for p in remote.root.iterdir())
    remote.error = OSError(errno.ECONNRESET, "connection reset")
    failing = commit(fast, 2)
    mirror.submit(failing)
    delivery = mirror.deliver(failing, timeout=10)  # one attempt, no retries: the job is going away
    # one attempt after deliver() began (one that failed before it may have been retried once)
    assert not delivery.uploaded and "connection reset" in (delivery.problem or "") and remote.attempts in (2, 3)
    mirror.raise_if_failed()  # reported in the delivery, not raised


def test_an_upload_that_stalls_is_a_failed_upload_warned_and_retried(fast: LocalStorage, remote: GatedStorage) -> None:
    mirror = Mirror(fast, remote, keep_last=5, stall_timeout=0.3, retry_first_s=0.05)
    remote.gate.clear()  # the endpoint accepts and goes silent
    record = commit(fast, 1)
    mirror.submit(record)
    deadline = time.monotonic() + 10
    while mirror.failed_uploads == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mirror.failed_uploads >= 1 and mirror.busy  # a failure, and a retry under way
    remote.gate.set()  # the endpoint is back: the stalled attempts come back too, late
    with pytest.warns(RuntimeWarning, match=r"made no progress for [0-9.]+s \(stall timeout 0.3s\)"):
        mirror.wait()
    time.sleep(0.5)  # the abandoned attempts finish after the retry listed the checkpoint
    assert [r.step for r in read_manifest(remote)] == [1]
    assert (remote.root / record.name).exists()  # a late attempt never deletes the listed copy


def test_a_stalled_upload_stops_by_the_failure_rules_and_close_returns(fast: LocalStorage, remote: GatedStorage) -> None:
    mirror = Mirror(fast, remote, keep_last=5, stall_timeout=0.2, retry_first_s=0.05, max_failures=2)
    remote.gate.clear()
    mirror.submit(commit(fast, 1))
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="made no progress"), pytest.raises(
        MirrorWriteError, match="2 failed upload.s. in a row"
    ):
        mirror.close()
    assert time.monotonic() - start < 5
    remote.gate.set()


def test_leave_does_not_wait_and_says_what_the_mirror_lacks(fast: LocalStorage, remote: GatedStorage) -> None:
    mirror = Mirror(fast, remote, keep_last=5)
    assert mirror.leave() is None  # nothing to upload
    mirror = mirror_holding_step_1(fast, remote)
    start = time.monotonic()
    lacks = mirror.leave()
    assert time.monotonic() - start < 1
    assert lacks is not None and "lacks step 1" in lacks and "holds no checkpoint of this session" in lacks
    remote.gate.set()
