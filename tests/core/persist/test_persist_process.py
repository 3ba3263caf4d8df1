"""The persist process, really started: writes, errors, a SIGKILLed child, a dead parent."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autockpt_core.errors import CheckpointWriteError
from autockpt_core.persist import LocalStorage, read_manifest, read_tensor_file
from autockpt_core.persist.persist_mode import choose_persist_mode, process_can_write
from autockpt_core.persist.persist_process import PersistProcess, PortableWrite
from autockpt_core.persist.shared_memory import INLINE_LIMIT, SharedArena, numpy_shared_pool, shared_memory_supported
from autockpt_core.persist.tensorfile import WRITE_TENSORS
from autockpt_core.persist.writer import PROCESS_FAILURES_BEFORE_OFF, CheckpointWriter, PersistJob

needs_shm = pytest.mark.skipif(not shared_memory_supported(), reason="needs os.memfd_create (Linux)")

from tests.core.persist.process_helpers import Hyper

HELPERS = "tests.core.persist.process_helpers"
ROOT = str(Path(__file__).resolve().parents[3])


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    arena = SharedArena()
    pool = numpy_shared_pool(arena)
    process = PersistProcess(arena, (HELPERS,))
    yield arena, pool, process
    process.close()
    arena.close()


def _arrays(pool, n: int = 1000):  # type: ignore[no-untyped-def]
    pool.begin_round()
    w = pool.get("w", (n,), np.float32)
    s = pool.get("s", (), np.int64)
    pool.end_round()
    w[...] = np.arange(n, dtype=np.float32)
    s[...] = 42
    return {"w": w, "s": s}


@needs_shm
def test_the_child_writes_a_safetensors_file_from_shared_buffers_atomically(shared, tmp_path: Path) -> None:
    _arena, pool, process = shared
    arrays = _arrays(pool)
    storage = LocalStorage(tmp_path)
    assert process.wait_ready(60)
    result = process.write_atomic(storage, "a.safetensors", PortableWrite(WRITE_TENSORS, {"arrays": arrays, "metadata": {"k": "v"}}).for_process_of(process.arena))
    data = (tmp_path / "a.safetensors").read_bytes()
    assert result.size == len(data) and result.checksum == f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"
    loaded, meta = read_tensor_file(data)
    np.testing.assert_array_equal(loaded["w"], arrays["w"])
    assert int(loaded["s"]) == 42 and meta == {"k": "v"}
    assert process.writes == 1 and not list(tmp_path.glob(".autockpt-tmp-*"))
    arrays["w"][0] = -1.0  # the child reads the same memory at the next write
    process.write_atomic(storage, "b.safetensors", PortableWrite(WRITE_TENSORS, {"arrays": arrays}).for_process_of(process.arena))
    assert read_tensor_file((tmp_path / "b.safetensors").read_bytes())[0]["w"][0] == -1.0


@needs_shm
def test_the_childs_error_is_raised_here_with_its_errno(shared, tmp_path: Path) -> None:
    _arena, pool, process = shared
    arrays = _arrays(pool)
    with pytest.raises(OSError) as info:
        process.write_atomic(LocalStorage(tmp_path), "a.bin", PortableWrite(f"{HELPERS}:disk_full", {"data": arrays["w"]}).for_process_of(process.arena))
    assert info.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []  # the child's write_atomic removed its temporary file


@needs_shm
def test_a_child_that_died_while_idle_is_replaced_at_the_next_write(shared, tmp_path: Path) -> None:
    _arena, pool, process = shared
    arrays = _arrays(pool)
    process.start()
    first = process.pid
    os.kill(first, signal.SIGKILL)
    time.sleep(0.2)
    process.write_atomic(LocalStorage(tmp_path), "a.bin", PortableWrite(f"{HELPERS}:write_bytes", {"data": arrays["w"]}).for_process_of(process.arena))
    assert process.pid != first and (tmp_path / "a.bin").read_bytes() == arrays["w"].tobytes()


def _writer_with_a_ready_process(shared, tmp_path: Path):  # type: ignore[no-untyped-def]
    _arena, pool, process = shared
    storage = LocalStorage(tmp_path)
    writer = CheckpointWriter(storage, keep_last=2, process=process)
    assert process.wait_ready(60)
    return _arrays(pool), storage, writer, process


def _job(arrays, name: str, step: int, function: str, **kwargs: object) -> PersistJob:  # type: ignore[no-untyped-def]
    portable = PortableWrite(function, {"data": arrays["w"], **kwargs})
    return PersistJob(name, step, 0, "test", write=lambda f: f.write(b"thread"), portable=portable)


@needs_shm
def test_a_child_killed_mid_write_costs_no_checkpoint_the_writer_thread_writes_it_and_the_later_ones(
    shared, tmp_path: Path
) -> None:
    arrays, storage, writer, process = _writer_with_a_ready_process(shared, tmp_path)
    writer.submit(_job(arrays, "ckpt-1.bin", 1, f"{HELPERS}:write_bytes"))
    writer.wait()
    assert process.writes == 1 and (tmp_path / "ckpt-1.bin").read_bytes() == arrays["w"].tobytes()
    marker = tmp_path.parent / "marker"
    writer.submit(_job(arrays, "ckpt-2.bin", 2, f"{HELPERS}:slow_write", marker=str(marker)))
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(".autockpt-tmp-*"))  # mid-write
    os.kill(int(marker.read_text()), signal.SIGKILL)
    with pytest.warns(RuntimeWarning, match="persist process failed writing ckpt-2.bin .*PersistProcessError"):
        writer.wait()
    assert [r.name for r in read_manifest(storage)] == ["ckpt-1.bin", "ckpt-2.bin"]
    assert (tmp_path / "ckpt-2.bin").read_bytes() == b"thread"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autockpt-manifest.json", "ckpt-1.bin", "ckpt-2.bin"]
    assert not process.disabled  # one failure: the process stays on, a new child starts
    writer.submit(_job(arrays, "ckpt-3.bin", 3, f"{HELPERS}:write_bytes"))
    writer.wait()
    assert (tmp_path / "ckpt-3.bin").read_bytes() == b"thread" and process.writes == 1  # not ready yet
    assert process.wait_ready(60)
    writer.submit(_job(arrays, "ckpt-4.bin", 4, f"{HELPERS}:write_bytes"))
    writer.wait()
    assert (tmp_path / "ckpt-4.bin").read_bytes() == arrays["w"].tobytes() and process.writes == 2


@needs_shm
@pytest.mark.parametrize(
    ("function", "kwargs", "error"),
    [
        (f"{HELPERS}:write_bytes", {"extra": Hyper(3)}, "UnpicklingError.*does not load tests.core.persist.process_helpers.Hyper"),
        (f"{HELPERS}:raise_value_error", {}, "ValueError: broken in the child"),
        ("no_such_module:write", {}, "ModuleNotFoundError"),
    ],
)
def test_any_failure_of_the_child_is_answered_by_the_writer_thread_and_repeated_ones_turn_it_off(
    shared, tmp_path: Path, function: str, kwargs: dict[str, object], error: str
) -> None:
    arrays, storage, writer, process = _writer_with_a_ready_process(shared, tmp_path)
    for step in range(1, PROCESS_FAILURES_BEFORE_OFF + 1):
        assert not process.disabled  # each failure before the last keeps the process on
        process.wait_ready(60)
        writer.submit(_job(arrays, f"ckpt-{step}.bin", step, function, **kwargs))
        with pytest.warns(RuntimeWarning, match=error):
            writer.wait()
        assert (tmp_path / f"ckpt-{step}.bin").read_bytes() == b"thread"
    assert [r.step for r in read_manifest(storage)][-1] == PROCESS_FAILURES_BEFORE_OFF
    assert process.disabled


@needs_shm
def test_a_storage_error_the_writer_thread_meets_too_is_the_checkpoints_failure(shared, tmp_path: Path) -> None:
    arrays, storage, writer, process = _writer_with_a_ready_process(shared, tmp_path)

    def full(_file: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    portable = PortableWrite(f"{HELPERS}:disk_full", {"data": arrays["w"]})
    writer.submit(PersistJob("ckpt-1.bin", 1, 0, "test", write=full, portable=portable))
    with pytest.raises(CheckpointWriteError, match="No space left"):
        writer.wait()
    assert read_manifest(storage) == [] and list(tmp_path.iterdir()) == []
    assert not process.disabled  # the storage failed, not the process


@needs_shm
def test_a_write_whose_large_arrays_are_not_shared_goes_to_the_writer_thread(shared, tmp_path: Path) -> None:
    _arena, _pool, process = shared
    private = np.zeros(INLINE_LIMIT // 4 + 1, dtype=np.float32)  # ordinary memory, over the limit
    assert PortableWrite(f"{HELPERS}:write_bytes", {"data": private}).for_process_of(process.arena) is None
    small = PortableWrite(f"{HELPERS}:write_bytes", {"data": private[:10]}).for_process_of(process.arena)
    assert small is not None and small.kwargs["data"].nbytes == 40  # carried by value


@needs_shm
def test_the_child_exits_when_the_training_process_is_sigkilled(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from autockpt_core.persist.persist_process import PersistProcess
        from autockpt_core.persist.shared_memory import SharedArena
        process = PersistProcess(SharedArena())
        process.start()
        print(process.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


FORKING_TRAINER = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from autockpt_core.persist.persist_process import PersistProcess
    from autockpt_core.persist.shared_memory import SharedArena, numpy_shared_pool
    arena = SharedArena()
    pool = numpy_shared_pool(arena)
    pool.begin_round()
    state = pool.get("w", (16 << 20,), np.float32)  # 64 MiB of snapshot buffers
    pool.end_round()
    state[...] = 1.0
    process = PersistProcess(arena)
    assert process.wait_ready(60)
    ready, told = os.pipe()
    sleeper = os.fork()
    if sleeper == 0:  # a long-lived helper the training script forked (a data-loader worker, a server)
        os.write(told, b"x")  # after the fork hooks ran
        time.sleep(120)
        os._exit(0)
    assert os.read(ready, 1) == b"x"
    print(process.pid, sleeper, flush=True)
    time.sleep(120)
    """
)


def _memfd_in(pid: int) -> list[str]:
    found = [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "autockpt-snapshot" in line]
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if "autockpt-snapshot" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                found.append(f"fd {fd}")
        except OSError:
            continue
    return found


@needs_shm
def test_a_forked_child_keeps_neither_the_persist_process_nor_the_snapshot_memory_alive() -> None:
    trainer = subprocess.Popen([sys.executable, "-c", FORKING_TRAINER], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert trainer.stdout is not None
    persist, sleeper = map(int, trainer.stdout.readline().split())  # printed once the sleeper's fork hooks ran
    try:
        assert _memfd_in(trainer.pid) and _memfd_in(sleeper) == []  # the fork let go of the segments at once
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait()
        deadline = time.monotonic() + 20
        while _alive(persist) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(persist) and _alive(sleeper)  # the sleeper did not hold the alive pipe open
        assert _memfd_in(sleeper) == []
    finally:
        os.kill(sleeper, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    "requested, kwargs, mode, reason",
    [
        ("auto", {}, "process", "auto: local directory"),
        ("auto", {"gpu": True}, "thread", "CUDA is available"),
        ("process", {"gpu": True}, "process", "requested"),
        ("thread", {}, "thread", "requested"),
        ("auto", {"local": False}, "thread", "not a plain local directory"),
        ("process", {"supported": False}, "thread", "need Linux"),
        ("auto", {"shareable": False}, "thread", "cannot be shared"),
        ("process", {"async_persist": False}, "thread", "async_persist=False"),
    ],
)
def test_choose_persist_mode(requested: str, kwargs: dict[str, bool], mode: str, reason: str) -> None:
    base = {"async_persist": True, "local": True, "supported": True, "shareable": True, "gpu": False}
    choice = choose_persist_mode(requested, **{**base, **kwargs})  # type: ignore[arg-type]
    assert choice.mode == mode and reason in choice.reason


class _CompressingStorage(LocalStorage):
    def write_atomic(self, name, write):  # type: ignore[no-untyped-def]
        return super().write_atomic(name, write)  # stands for a subclass that changes the bytes


class _DeclaredStorage(_CompressingStorage):
    process_writable = True  # its override does not change checkpoint files (e.g. test hooks)


class _PlainSubclass(LocalStorage):
    pass


@pytest.mark.parametrize(
    ("make", "can"),
    [
        (lambda root: LocalStorage(root), True),
        (lambda root: _PlainSubclass(root), True),  # write_atomic untouched
        (lambda root: _CompressingStorage(root), False),  # the child would bypass its override
        (lambda root: _DeclaredStorage(root), True),
        (lambda root: object(), False),  # not a local directory (fsspec storage)
    ],
)
def test_a_persist_process_writes_only_storages_it_writes_the_same_way(tmp_path: Path, make: Any, can: bool) -> None:
    assert process_can_write(make(tmp_path)) is can


@needs_shm
def test_the_child_ignores_preemption_signals_sent_to_the_whole_group(shared, tmp_path: Path) -> None:
    _arena, pool, process = shared
    arrays = _arrays(pool)
    assert process.wait_ready(60)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        os.kill(process.pid, signum)
    time.sleep(0.2)
    pid = process.pid
    process.write_atomic(LocalStorage(tmp_path), "a.bin", PortableWrite(f"{HELPERS}:write_bytes", {"data": arrays["w"]}).for_process_of(process.arena))
    assert process.pid == pid and (tmp_path / "a.bin").exists()


@needs_shm
def test_a_child_that_cannot_start_disables_the_process_and_the_writer_thread_writes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    arena = SharedArena()
    unstartable = PersistProcess(arena)
    unstartable.start()  # FileNotFoundError: logged, not raised
    assert unstartable.disabled and unstartable.pid is None and not unstartable.ready()
    monkeypatch.undo()
    process = PersistProcess(arena)
    # A child whose import fails (the module name is wrong) dies before it is ready:
    monkeypatch.setattr("autockpt_core.persist.persist_process.CHILD_MODULE", "autockpt_core.persist.no_such_child")
    storage = LocalStorage(tmp_path)
    writer = CheckpointWriter(storage, keep_last=2, process=process)
    step = 0
    while not process.disabled and step < 100:  # each child takes ~0.5 s to die
        step += 1
        portable = PortableWrite(f"{HELPERS}:write_bytes", {"data": b"x"})
        writer.submit(PersistJob(f"ckpt-{step}.bin", step, 0, "test", write=lambda f: f.write(b"thread"), portable=portable))
        writer.wait()
        time.sleep(0.1)
    assert process.disabled and process.writes == 0 and process.pid is None
    assert [r.step for r in read_manifest(storage)] == [step - 1, step]
    assert (tmp_path / f"ckpt-{step}.bin").read_bytes() == b"thread"  # every checkpoint was written
    arena.close()
