"""A session with a local fast tier and a mirror (``Config.mirror``): what reaches each tier,
resume on a fresh node, failures, and the settings' checks. The S3 cases run against a real
S3-compatible server (``moto.server`` on 127.0.0.1, ``tests/s3_server.py``)."""

from __future__ import annotations

import errno
import time
import uuid
from pathlib import Path
from typing import IO, Any, Callable

import numpy as np
import pytest

from autockpt_core import CheckpointSession, Config, Snapshot, read_manifest, read_tensor_file, write_tensor_file
from autockpt_core.errors import ConfigError, MirrorWriteError
from autockpt_core.persist import LocalStorage, WriteResult, storage_for
from autockpt_core.persist.storage import FsspecStorage


def snapshot_of(value: float) -> Callable[[Any], Snapshot]:
    def snapshot(pool: Any) -> Snapshot:
        buf = pool.get("w", (1024,), np.float32)
        buf[:] = value
        return Snapshot(write=lambda f: write_tensor_file(f, {"w": buf}), nbytes=buf.nbytes)

    return snapshot


def train(session: CheckpointSession, steps: range) -> None:
    """Checkpoint after each step of ``steps``; the state's value is the step."""
    session.start(steps.start - 1)
    for step in steps:
        session.step_end(step)
        session.save(step, 0, snapshot_of(float(step)))
    session.finish()


def value_of(storage: Any, name: str) -> float:
    with storage.open_read(name) as f:
        arrays, _ = read_tensor_file(f.read())
    return float(arrays["w"][0])


def session_for(dirpath: Path, mirror: str, **config: Any) -> CheckpointSession:
    cfg = Config(dirpath=str(dirpath), mirror=mirror, every_n_steps=1000, warmup_steps=0, verbose=False, **config)
    return CheckpointSession(cfg, framework="np", suffix=".safetensors")


def test_every_checkpoint_reaches_the_mirror_and_each_tier_keeps_its_own_number(tmp_path: Path) -> None:
    session = session_for(tmp_path / "fast", str(tmp_path / "mirror"), keep_last=1, mirror_keep_last=3)
    train(session, range(1, 6))
    fast, mirror = LocalStorage(tmp_path / "fast"), LocalStorage(tmp_path / "mirror")
    assert [r.step for r in read_manifest(fast)] == [5]
    steps = [r.step for r in read_manifest(mirror)]
    assert steps[-1] == 5 and len(steps) == min(3, session.mirror.mirrored)  # type: ignore[union-attr]
    assert value_of(mirror, read_manifest(mirror)[-1].name) == 5.0
    summary = session.summary()
    assert summary.mirrored >= 1 and summary.mirrored + session.mirror.superseded == 5  # type: ignore[union-attr]
    assert summary.line().endswith(f", {summary.mirrored} mirrored to {tmp_path / 'mirror'}")


def test_a_fresh_node_resumes_from_the_mirror_and_continues_both_tiers(tmp_path: Path) -> None:
    train(session_for(tmp_path / "node-a", str(tmp_path / "mirror")), range(1, 4))
    node_b = session_for(tmp_path / "node-b", str(tmp_path / "mirror"))
    record = node_b.resume_record()
    assert record is not None and record.step == 3
    assert value_of(node_b.storage, record.name) == 3.0  # copied into node b's fast tier, read locally
    assert [r.step for r in read_manifest(node_b.storage)] == [3] and node_b.run == record.run
    train(node_b, range(4, 6))
    mirror = LocalStorage(tmp_path / "mirror")
    assert [r.step for r in read_manifest(mirror)][-1] == 5 and {r.run for r in read_manifest(mirror)} == {record.run}
    # Back on node a, whose disk still holds steps 1-3: the mirror's step 5 wins, not a's step 3.
    node_a = session_for(tmp_path / "node-a", str(tmp_path / "mirror"))
    again = node_a.resume_record()
    assert again is not None and again.step == 5 and value_of(node_a.storage, again.name) == 5.0
    node_a.close()


def test_preemption_flush_returns_once_the_mirror_has_the_checkpoint(tmp_path: Path) -> None:
    session = session_for(tmp_path / "fast", str(tmp_path / "mirror"))
    session.start(0)
    session.step_end(1)
    session.save(1, 0, snapshot_of(1.0), reason="preempted (SIGTERM)")
    session.flush()
    assert [r.step for r in read_manifest(LocalStorage(tmp_path / "mirror"))] == [1]
    session.close()


class FailingMirror(LocalStorage):
    def write_atomic(self, name: str, write: Callable[[IO[bytes]], object]) -> WriteResult:
        if name.startswith("ckpt-"):
            raise OSError(errno.EIO, "connection reset by peer")
        return super().write_atomic(name, write)


def test_failed_uploads_are_retried_and_stop_the_run_only_after_mirror_max_failures(tmp_path: Path) -> None:
    session = session_for(tmp_path / "fast", str(tmp_path / "mirror"), mirror_max_failures=2)
    session.mirror.target = FailingMirror(tmp_path / "mirror")  # type: ignore[union-attr]
    session.mirror.retry_first_s = 0.01  # type: ignore[union-attr]
    session.start(0)
    session.step_end(1)
    session.save(1, 0, snapshot_of(1.0))
    session.writer.wait()
    deadline = time.monotonic() + 10
    while session.mirror.busy and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.01)  # both uploads failed in the background; step_end must raise it
    with pytest.warns(RuntimeWarning, match="upload 1 of .* connection reset by peer.*trying again"):
        with pytest.raises(MirrorWriteError, match="2 failed upload.*in a row.*connection reset by peer"):
            session.step_end(2)
    assert [r.step for r in read_manifest(session.storage)] == [1]
    session.close()


def test_an_unreadable_mirror_does_not_block_a_resume_from_dirpath(tmp_path: Path) -> None:
    fast, mirror = tmp_path / "fast", tmp_path / "mirror"
    train(session_for(fast, str(mirror)), range(1, 4))
    (mirror / "autockpt-manifest.json").write_text("{ not json")  # or an outage: any read error
    rerun = session_for(fast, str(mirror))
    with pytest.warns(RuntimeWarning, match="the mirror .* cannot be read .*resuming from the newest checkpoint in"):
        record = rerun.resume_record()
    assert record is not None and record.step == 3 and not rerun.copied_from_mirror
    rerun.close()


def test_an_unwritable_mirror_warns_but_lets_a_run_with_local_checkpoints_go_on(tmp_path: Path) -> None:
    fast, mirror = tmp_path / "fast", tmp_path / "mirror"
    train(session_for(fast, str(mirror)), range(1, 3))
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a directory")  # every write under it fails
    rerun = session_for(fast, str(blocked / "mirror"))
    with pytest.warns(RuntimeWarning, match="cannot be written now .*training goes on from the checkpoints in"):
        rerun.open()
    rerun.close()
    fresh = session_for(tmp_path / "empty", str(blocked / "mirror"))
    with pytest.raises(ConfigError, match="mirror="):  # nothing to go on from: a setup error, at once
        fresh.open()


@pytest.mark.parametrize(
    ("config", "field", "problem"),
    [
        (dict(dirpath="ckpts", mirror="ckpts/"), "mirror", "is dirpath='ckpts' itself"),
        (dict(dirpath="s3://b/run", mirror="s3://b/run/"), "mirror", "itself"),
        (dict(dirpath="ckpts", mirror=""), "mirror", "non-empty"),
        (dict(dirpath="ckpts", mirror_keep_last=2), "mirror_keep_last", "no mirror is set"),
        (dict(dirpath="ckpts", mirror="m", mirror_keep_last=0), "mirror_keep_last", "at least 1"),
        (dict(dirpath="ckpts", mirror="other", storage_options={"anon": True}), "storage_options", "are local"),
    ],
)
def test_bad_mirror_settings_name_the_field(config: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as info:
        Config(**config)
    assert info.value.field == field


def test_storage_options_go_to_the_url_tier_only(tmp_path: Path) -> None:
    cfg = Config(dirpath=str(tmp_path / "fast"), mirror="memory://autockpt-options-test",
                 storage_options={"skip_instance_cache": True})  # fmt: skip
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors")
    assert isinstance(session.storage, LocalStorage) and isinstance(session.mirror.target, FsspecStorage)  # type: ignore[union-attr]


def test_an_unwritable_mirror_fails_at_train_start_naming_mirror(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    session = session_for(tmp_path / "fast", str(tmp_path / "a-file" / "mirror"))
    with pytest.raises(ConfigError) as info:
        session.start(0)
    assert info.value.field == "mirror" and "cannot be written" in str(info.value)
    assert "point mirror to a directory" in str(info.value)
    again = session_for(tmp_path / "fast", str(tmp_path / "mirror"))  # the fast tier's lock was given back
    again.start(0)
    again.close()


def test_an_s3_mirror_on_a_real_server_serves_a_fresh_node(tmp_path: Path, s3_server: Any) -> None:
    url = s3_server.url(f"mirror-{uuid.uuid4().hex[:8]}")
    options = s3_server.storage_options
    first = session_for(tmp_path / "node-a", url, storage_options=options, mirror_keep_last=2)
    train(first, range(1, 5))
    remote = storage_for(url, options)
    steps = [r.step for r in read_manifest(remote)]  # uploads slower than steps skip the ones between
    assert steps[-1] == 4 and len(steps) == 2
    assert value_of(remote, read_manifest(remote)[-1].name) == 4.0
    fresh = session_for(tmp_path / "node-b", url, storage_options=options, mirror_keep_last=2)
    record = fresh.resume_record()
    assert record is not None and record.step == 4 and fresh.path_of(record).startswith(str(tmp_path / "node-b"))
    assert value_of(fresh.storage, record.name) == 4.0
    fresh.close()


LAGGING_MIRROR = """
import sys, threading
import numpy as np
from autockpt_core import CheckpointSession, Config, Snapshot, write_tensor_file

fast, mirror = sys.argv[1], sys.argv[2]
session = CheckpointSession(
    Config(dirpath=fast, mirror=mirror, every_n_steps=1000, warmup_steps=0, verbose=False, keep_last=2),
    framework="np", suffix=".safetensors",
)
target = session.mirror.target
upload = target.write_atomic
held = threading.Event()

def slow_upload(name, write):  # the first checkpoint reaches the mirror, the next upload hangs
    if name.startswith("ckpt-") and not name.startswith("ckpt-step000000001"):
        held.set()
        threading.Event().wait()
    return upload(name, write)

target.write_atomic = slow_upload

def snapshot_of(value):
    def snapshot(pool):
        buf = pool.get("w", (1024,), np.float32)
        buf[:] = value
        return Snapshot(write=lambda f: write_tensor_file(f, {"w": buf}), nbytes=buf.nbytes)
    return snapshot

session.start(0)
for step in range(1, 7):
    session.step_end(step)
    session.save(step, 0, snapshot_of(float(step)))
    session.writer.wait()  # committed in the fast tier
    if step == 1:
        session.mirror.wait()  # listed in the mirror
held.wait()
print("ready", flush=True)
threading.Event().wait()  # SIGKILLed here, uploads lagging by 5 checkpoints (keep_last=2)
"""


def test_a_mirror_lagging_by_keep_last_or_more_never_resumes_older_than_the_nodes_own_work(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    fast, mirror = tmp_path / "fast", tmp_path / "mirror"
    proc = subprocess.Popen(
        [sys.executable, "-c", LAGGING_MIRROR, str(fast), str(mirror)], cwd=root, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [r.step for r in read_manifest(LocalStorage(mirror))] == [1]
    # beyond keep_last=2 the fast tier kept the file of the upload in flight (step 2); the mirror
    # lists step 1 only, which this node's retention dropped: the node is ahead in the same run
    assert [r.step for r in read_manifest(LocalStorage(fast))] == [2, 5, 6]
    rerun = session_for(fast, str(mirror), keep_last=2)
    record = rerun.resume_record()
    assert record is not None and record.step == 6 and not rerun.copied_from_mirror
    assert value_of(rerun.storage, record.name) == 6.0
    rerun.start(6)
    for step in (7, 8):
        rerun.step_end(step)
        rerun.save(step, 0, snapshot_of(float(step)))
    rerun.finish()  # the mirror has step 8 now: the file kept for the hung upload goes
    assert [r.step for r in read_manifest(LocalStorage(fast))] == [7, 8]
    assert read_manifest(LocalStorage(mirror))[-1].step == 8


class CountingMirror(LocalStorage):
    """A local mirror that counts the checkpoint files read from it."""

    reads: list[str] = []

    def open_read(self, name: str) -> IO[bytes]:
        if name.startswith("ckpt-"):
            CountingMirror.reads.append(name)
        return super().open_read(name)


def test_the_mirror_is_read_once_on_a_fresh_node_and_not_at_all_when_the_local_tier_wins(tmp_path: Path) -> None:
    fast, mirror = tmp_path / "fast", tmp_path / "mirror"
    train(session_for(fast, str(mirror)), range(1, 4))
    CountingMirror.reads = []
    rerun = session_for(fast, str(mirror))
    rerun.mirror.target = CountingMirror(mirror)  # type: ignore[union-attr]
    record = rerun.resume_record()
    rerun.close()
    assert record is not None and record.step == 3 and CountingMirror.reads == []  # this node's own copy
    fresh = session_for(tmp_path / "fresh", str(mirror))
    fresh.mirror.target = CountingMirror(mirror)  # type: ignore[union-attr]
    record = fresh.resume_record()
    fresh.close()
    assert record is not None and fresh.copied_from_mirror and len(CountingMirror.reads) == 1  # checked while copied


def test_a_fresh_node_skips_a_corrupt_newest_checkpoint_in_the_mirror(tmp_path: Path) -> None:
    fast, mirror = tmp_path / "fast", tmp_path / "mirror"
    train(session_for(fast, str(mirror), mirror_keep_last=3), range(1, 4))
    previous, newest = read_manifest(LocalStorage(mirror))[-2:]
    (mirror / newest.name).write_bytes(b"torn upload")
    fresh = session_for(tmp_path / "fresh", str(mirror))
    with pytest.warns(RuntimeWarning, match=f"skipping checkpoint {newest.name}"):
        record = fresh.resume_record()
    assert record is not None and record.step == previous.step and fresh.copied_from_mirror
    assert value_of(fresh.storage, record.name) == float(record.step)
    assert [r.step for r in read_manifest(fresh.storage)] == [record.step]  # nothing of the corrupt one
    fresh.close()
