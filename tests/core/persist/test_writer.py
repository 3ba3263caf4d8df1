import dataclasses
import threading

import pytest

from autockpt_core import (
    CheckpointWriteError,
    CheckpointWriter,
    LocalStorage,
    PersistJob,
    find_latest_valid,
    read_manifest,
)
from tests.faults import FailingStorage


def job(step: int, payload: bytes = b"x" * 5000, write=None) -> PersistJob:
    return PersistJob(
        name=f"ckpt-{step}.bin", step=step, epoch=0, framework="t", write=write or (lambda f: f.write(payload))
    )


@pytest.mark.parametrize("run_async", [True, False])
def test_retention_keeps_last_n_after_commit(tmp_path, run_async) -> None:
    w = CheckpointWriter(LocalStorage(tmp_path), keep_last=2, run_async=run_async)
    for step in range(1, 6):
        w.submit(job(step))
    w.close()
    assert [r.step for r in read_manifest(LocalStorage(tmp_path))] == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autockpt-manifest.json", "ckpt-4.bin", "ckpt-5.bin"]


@pytest.mark.parametrize("run_async", [True, False])
def test_failure_mid_write_keeps_previous_newest_and_reraises_in_caller(tmp_path, run_async) -> None:
    storage = FailingStorage(tmp_path, fail_after=1234)
    w = CheckpointWriter(storage, keep_last=1, run_async=run_async)
    w.submit(job(1, b"a" * 5000))
    w.wait()
    storage.armed = True
    if run_async:
        w.submit(job(2, b"b" * 5000))
        with pytest.raises(CheckpointWriteError, match="No space left") as info:
            w.wait()
    else:
        with pytest.raises(CheckpointWriteError, match="No space left") as info:
            w.submit(job(2, b"b" * 5000))
    assert "ckpt-2.bin" in str(info.value) and "Older checkpoints are untouched" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    w.raise_if_failed()  # raised once only
    newest = find_latest_valid(storage)
    assert newest is not None and newest.step == 1  # keep_last=1 did not delete it
    assert (tmp_path / "ckpt-1.bin").read_bytes() == b"a" * 5000
    assert not (tmp_path / "ckpt-2.bin").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".autockpt-tmp")] == []


def test_ctrl_c_during_a_synchronous_persist_stays_a_keyboard_interrupt(tmp_path) -> None:
    w = CheckpointWriter(LocalStorage(tmp_path), keep_last=1, run_async=False)
    w.submit(job(1, b"a" * 5000))

    def interrupted(f):
        f.write(b"partial")
        raise KeyboardInterrupt  # what Ctrl-C raises in the training thread mid-write

    with pytest.raises(KeyboardInterrupt):  # not a CheckpointWriteError advising free space
        w.submit(job(2, write=interrupted))
    w.raise_if_failed()  # nothing else pending
    assert [r.step for r in read_manifest(LocalStorage(tmp_path))] == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autockpt-manifest.json", "ckpt-1.bin"]


def test_serializer_exception_is_stored_and_raised_on_next_call(tmp_path) -> None:
    w = CheckpointWriter(LocalStorage(tmp_path), keep_last=3)

    def bad(f):
        f.write(b"partial")
        raise RuntimeError("serializer exploded")

    w.submit(job(1, write=bad))
    w._thread.join()  # the background thread has finished; error is pending
    with pytest.raises(CheckpointWriteError, match="serializer exploded"):
        w.raise_if_failed()
    assert read_manifest(LocalStorage(tmp_path)) == []


def test_at_most_one_persist_in_flight(tmp_path) -> None:
    release = threading.Event()
    running = []

    def slow(f):
        running.append(threading.current_thread().name)
        release.wait(5)
        f.write(b"z")

    w = CheckpointWriter(LocalStorage(tmp_path), keep_last=3)
    w.submit(job(1, write=slow))
    assert w.busy
    t = threading.Thread(target=w.submit, args=(job(2),))
    t.start()
    t.join(0.2)
    assert t.is_alive()  # second submit waits for the first
    release.set()
    t.join(5)
    w.close()
    assert [r.step for r in read_manifest(LocalStorage(tmp_path))] == [1, 2]
    assert running == ["autockpt-persist"]


class BackwardsClock:
    """A wall clock that goes back ``step`` seconds at every reading (another node's clock)."""

    def __init__(self, start: float = 1_000_000.0, step: float = 10.0) -> None:
        self.t, self.step = start, step

    def __call__(self) -> float:
        self.t -= self.step
        return self.t


def test_newest_and_retention_follow_commit_order_when_the_clock_goes_backwards(tmp_path) -> None:
    storage = LocalStorage(tmp_path)
    w = CheckpointWriter(storage, keep_last=2, run_async=False, wall_clock=BackwardsClock())
    for step in (1, 2, 3):
        w.submit(job(step))
    records = read_manifest(storage)
    assert [(r.step, r.seq) for r in records] == [(2, 2), (3, 3)]  # the newest commit is kept
    assert records[0].created > records[1].created  # although its clock says it is older
    assert find_latest_valid(storage).step == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autockpt-manifest.json", "ckpt-2.bin", "ckpt-3.bin"]


def test_a_resumed_run_on_a_node_whose_clock_is_behind_keeps_its_new_checkpoint(tmp_path) -> None:
    storage = LocalStorage(tmp_path)
    ahead = CheckpointWriter(storage, keep_last=1, run_async=False, wall_clock=lambda: 2_000_000.0)
    ahead.submit(job(300))
    behind = CheckpointWriter(storage, keep_last=1, run_async=False, wall_clock=lambda: 1_000_000.0)
    behind.submit(job(301))  # resumed from 300 on a node whose clock is behind
    assert [r.step for r in read_manifest(storage)] == [301]
    assert (tmp_path / "ckpt-301.bin").exists() and not (tmp_path / "ckpt-300.bin").exists()


@pytest.mark.parametrize(
    "framework, run, dropped",
    [
        ("t", "run-a", {1, 2, 3}),  # the same framework and run: keep_last=2 counts them
        ("t", "run-b", set()),  # another run of the same framework: never dropped
        ("keras", "run-a", set()),  # another framework: never dropped
        ("t", None, set()),  # records written before run ids: a run of their own
    ],
)
def test_retention_drops_only_records_of_the_same_framework_and_run(tmp_path, framework, run, dropped) -> None:
    storage = LocalStorage(tmp_path)
    other = CheckpointWriter(storage, keep_last=3, run_async=False)
    for step in (1, 2, 3):
        other.submit(dataclasses.replace(job(step), framework=framework, run=run))
    w = CheckpointWriter(storage, keep_last=2, run_async=False)
    for step in (4, 5):
        w.submit(dataclasses.replace(job(step), run="run-a"))
    assert [r.step for r in read_manifest(storage)] == [s for s in (1, 2, 3, 4, 5) if s not in dropped]
    for step in (1, 2, 3):
        assert (tmp_path / f"ckpt-{step}.bin").exists() == (step not in dropped)
