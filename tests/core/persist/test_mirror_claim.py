"""One writer per mirror: a local mirror directory is locked, a URL mirror claimed
(``autockpt_core.persist.mirror_claim``). Second sessions in another process, in this process
and on another host (a claim written as that host's) are refused while the holder lives and
take over once it is gone; a holder whose claim is taken over stops its mirror. The URL cases
run against a real S3-compatible server (moto on 127.0.0.1) or fsspec's memory store."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autockpt_core import CheckpointSession, Config, DirectoryLockedError, Snapshot, write_tensor_file
from autockpt_core.errors import ConfigError, MirrorWriteError
from autockpt_core.persist import mirror_claim
from autockpt_core.persist.lock import LOCK_NAME
from autockpt_core.persist.mirror_claim import CLAIM_NAME, Claim, MirrorClaim, read_claim
from autockpt_core.persist.process_identity import ProcessIdentity, start_ticks
from autockpt_core.persist.storage import FsspecStorage, modified_time
from tests.core.persist.holding import ROOT


def session_for(dirpath: Path, mirror: str, **config: Any) -> CheckpointSession:
    cfg = Config(dirpath=str(dirpath), mirror=mirror, every_n_steps=1000, warmup_steps=0, verbose=False, **config)
    return CheckpointSession(cfg, framework="np", suffix=".safetensors")


def snapshot(pool: Any) -> Snapshot:
    buf = pool.get("w", (16,), np.float32)
    buf[:] = 1.0
    return Snapshot(write=lambda f: write_tensor_file(f, {"w": buf}), nbytes=buf.nbytes)


HOLD = """
import sys
from autockpt_core import CheckpointSession, Config
from autockpt_core.persist import mirror_claim
mirror_claim.HEARTBEAT_S = 0.2
options = {"endpoint_url": sys.argv[3], "key": "testing", "secret": "testing"} if sys.argv[3] else None
session = CheckpointSession(
    Config(dirpath=sys.argv[1], mirror=sys.argv[2], storage_options=options, verbose=False),
    framework="holder-fw", suffix=".st",
)
session.start(0)
print("HELD", flush=True)
sys.stdin.readline()
session.finish()
print("RELEASED", flush=True)
sys.stdin.readline()
"""


class Holder:
    """A real second process whose session holds ``mirror`` until told or killed."""

    def __init__(self, dirpath: Path, mirror: str, endpoint: str = "") -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(dirpath), mirror, endpoint],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert self.readline() == "HELD"

    def readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the holder process ended early (rc={self.proc.poll()})"
        return line.strip()

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("finish\n")
        self.proc.stdin.flush()
        assert self.readline() == "RELEASED"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture()
def holders():
    started: list[Holder] = []

    def start(*args: Any) -> Holder:
        started.append(Holder(*args))
        return started[-1]

    yield start
    for holder in started:
        if holder.proc.poll() is None:
            holder.kill()


def test_a_local_mirror_is_locked_against_a_run_in_another_process(tmp_path: Path, holders) -> None:
    mirror = tmp_path / "mirror"
    holder = holders(tmp_path / "node-a", str(mirror))
    with pytest.raises(DirectoryLockedError) as info:
        session_for(tmp_path / "node-b", str(mirror)).start(0)
    message = str(info.value)
    assert f"pid {holder.proc.pid}" in message and "as its mirror" in message and "another mirror" in message
    assert "resume each other's runs" in message
    holder.kill()  # SIGKILL: the operating system drops the lock
    second = session_for(tmp_path / "node-b", str(mirror))
    second.start(0)
    assert json.loads((mirror / LOCK_NAME).read_text())["pid"] == os.getpid()
    second.finish()
    assert not (mirror / LOCK_NAME).exists()


def test_two_sessions_of_one_process_cannot_share_a_local_mirror(tmp_path: Path) -> None:
    first = session_for(tmp_path / "a", str(tmp_path / "mirror"))
    first.start(0)
    with pytest.raises(DirectoryLockedError, match="in this process"):
        session_for(tmp_path / "b", str(tmp_path / "mirror")).start(0)
    first.finish()
    second = session_for(tmp_path / "b", str(tmp_path / "mirror"))
    second.start(0)
    second.finish()


def test_an_s3_mirror_claimed_by_a_live_run_is_refused_and_taken_over_once_it_is_killed(
    tmp_path: Path, s3_server: Any, holders, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = s3_server.url(f"claimed-{uuid.uuid4().hex[:8]}")
    options = s3_server.storage_options
    holder = holders(tmp_path / "node-a", url, s3_server.endpoint)
    monkeypatch.setattr(mirror_claim, "STALE_AFTER_S", 30.0)  # the holder renews every 0.2 s
    with pytest.raises(DirectoryLockedError) as info:
        session_for(tmp_path / "node-b", url, storage_options=options).start(0)
    message = str(info.value)
    assert f"pid {holder.proc.pid}" in message and "'holder-fw'" in message and "another mirror" in message
    assert info.value.holder is not None and info.value.holder["pid"] == holder.proc.pid
    holder.kill()  # its claim stays in the bucket, unrenewed
    remote = FsspecStorage(url, options)
    assert (claim := read_claim(remote)) is not None and claim.pid == holder.proc.pid
    caplog.clear()
    caplog.set_level(logging.INFO, logger="autockpt")
    second = session_for(tmp_path / "node-b", url, storage_options=options)
    second.start(0)  # same host, its process gone: taken over at once, without watching the claim
    assert "left from a process that ended" in caplog.text and "waiting up to" not in caplog.text
    assert (claim := read_claim(remote)) is not None and claim.pid == os.getpid()
    second.step_end(1)
    second.save(1, 0, snapshot)
    second.finish()
    assert read_claim(remote) is None  # released with the session
    third = session_for(tmp_path / "node-c", url, storage_options=options)
    record = third.resume_record()
    assert record is not None and record.step == 1
    third.close()


def test_a_released_claim_lets_the_next_run_in_at_once(tmp_path: Path, s3_server: Any, holders) -> None:
    url = s3_server.url(f"released-{uuid.uuid4().hex[:8]}")
    holder = holders(tmp_path / "node-a", url, s3_server.endpoint)
    holder.release()
    session = session_for(tmp_path / "node-b", url, storage_options=s3_server.storage_options)
    session.start(0)
    session.finish()


def foreign_claim(storage: FsspecStorage, beat: int = 0, session: str = "other-session") -> Claim:
    claim = Claim(session, "run-of-node-b", "node-b", 4242, "np", time.time(), beat)
    data = json.dumps(dataclasses.asdict(claim)).encode()
    storage.write_atomic(CLAIM_NAME, lambda f: f.write(data))
    return claim


class FakeTime:
    """A clock that ``sleep`` advances; ``on_sleep`` runs at each sleep (another host's heartbeat)."""

    def __init__(self, on_sleep: Any = None) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self)


def claim_on(storage: FsspecStorage, fake: FakeTime, lost: list[str] | None = None) -> MirrorClaim:
    sink = lost if lost is not None else []
    return MirrorClaim(
        storage, "np", lambda: "my-run", sink.append, heartbeat_s=3600, stale_after_s=45, sleep=fake.sleep,
        clock=fake.clock,
    )  # fmt: skip


def memory_mirror() -> FsspecStorage:
    return FsspecStorage(f"memory://claims/{uuid.uuid4().hex[:8]}")


@pytest.mark.parametrize(
    ("renewed_by_other_host", "outcome"),
    [(True, "refused"), (False, "taken over after watching 45 s")],
)
def test_another_hosts_claim_is_watched_until_renewed_or_stale(renewed_by_other_host: bool, outcome: str) -> None:
    storage = memory_mirror()
    foreign_claim(storage)

    def other_host_beats(fake: FakeTime) -> None:
        if renewed_by_other_host and fake.sleeps == 3:
            foreign_claim(storage, beat=1)

    fake = FakeTime(other_host_beats)
    claim = claim_on(storage, fake)
    if outcome == "refused":
        with pytest.raises(DirectoryLockedError) as info:
            claim.take(store_now=None)
        assert "host node-b, pid 4242" in str(info.value) and "run run-of-node-b" in str(info.value)
        assert fake.now == pytest.approx(3.0)  # refused at the first renewal seen
        assert read_claim(storage).session == "other-session"  # type: ignore[union-attr]
    else:
        claim.take(store_now=None)
        assert fake.now >= 45.0
        assert (mine := read_claim(storage)) is not None and mine.session == claim.session and mine.run == "my-run"
        claim.release()
        assert read_claim(storage) is None


def test_a_claim_the_stores_clock_shows_stale_is_taken_over_without_waiting() -> None:
    storage = memory_mirror()
    foreign_claim(storage)
    renewed = modified_time(storage, CLAIM_NAME)
    assert renewed is not None
    fake = FakeTime()
    claim = claim_on(storage, fake)
    claim.take(store_now=renewed + 46.0)
    assert fake.sleeps == 0 and read_claim(storage).session == claim.session  # type: ignore[union-attr]
    claim.release()
    foreign_claim(storage)  # renewed 10 s before the probe by the store's clock: watched, and renewed
    watched = FakeTime(lambda fake: foreign_claim(storage, beat=5) if fake.sleeps == 1 else None)
    with pytest.raises(DirectoryLockedError):
        claim_on(storage, watched).take(store_now=modified_time(storage, CLAIM_NAME) + 10.0)  # type: ignore[operator]
    assert watched.sleeps == 1


def test_a_holder_whose_claim_is_taken_over_stops_its_mirror(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(mirror_claim, "HEARTBEAT_S", 0.05)
    url = f"memory://claims/{uuid.uuid4().hex[:8]}"
    session = session_for(tmp_path / "fast", url)
    session.start(0)
    storage = FsspecStorage(url)
    assert (mine := read_claim(storage)) is not None and mine.host == socket.gethostname()
    foreign_claim(storage)  # another host took the mirror (it judged this session gone)
    deadline = time.monotonic() + 30
    with pytest.raises(MirrorWriteError, match="another session took over the mirror"):
        while time.monotonic() < deadline:
            session.step_end(1)
            time.sleep(0.05)
    session.save(2, 0, snapshot)
    session.finish()  # the local checkpoint is committed; nothing more is uploaded
    assert [r.step for r in session.records()] == [2]
    assert read_claim(storage).session == "other-session"  # type: ignore[union-attr]  # not deleted by the loser


def test_a_session_of_this_process_refuses_a_second_one_until_it_is_closed_or_collected(tmp_path: Path) -> None:
    url = f"memory://claims/{uuid.uuid4().hex[:8]}"
    first = session_for(tmp_path / "a", url)
    first.start(0)
    with pytest.raises(DirectoryLockedError, match="in this process"):
        session_for(tmp_path / "b", url).start(0)
    del first  # dropped without finish(): its claim goes with it
    gc.collect()
    second = session_for(tmp_path / "b", url)
    second.start(0)
    second.finish()


SECOND_IN_ITS_OWN_PID_NAMESPACE = """
import sys
from autockpt_core import CheckpointSession, Config, DirectoryLockedError
from autockpt_core.persist import mirror_claim
mirror_claim.STALE_AFTER_S = 10.0  # the holder renews every 0.2 s
options = {"endpoint_url": sys.argv[3], "key": "testing", "secret": "testing"}
session = CheckpointSession(
    Config(dirpath=sys.argv[1], mirror=sys.argv[2], storage_options=options, verbose=False),
    framework="np", suffix=".st",
)
try:
    session.start(0)
except DirectoryLockedError as exc:
    print("REFUSED", exc, flush=True)
else:
    print("TOOK", flush=True)
    session.finish()
"""


def _own_pid_namespace_command() -> list[str] | None:
    """``unshare`` into a new PID namespace with its own /proc, where this machine allows it."""
    for command in (["unshare", "--pid", "--fork", "--mount-proc"],
                    ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]):  # fmt: skip
        try:
            probe = subprocess.run([*command, "true"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if probe.returncode == 0:
            return command
    return None


def test_a_second_job_in_another_pid_namespace_of_this_host_is_refused_and_the_first_trains_on(
    tmp_path: Path, s3_server: Any, holders
) -> None:
    unshare = _own_pid_namespace_command()
    if unshare is None:
        pytest.skip("this machine does not allow a new PID namespace (unshare --pid --fork --mount-proc)")
    url = s3_server.url(f"pidns-{uuid.uuid4().hex[:8]}")
    holder = holders(tmp_path / "node-a", url, s3_server.endpoint)
    second = subprocess.run(
        [*unshare, sys.executable, "-c", SECOND_IN_ITS_OWN_PID_NAMESPACE, str(tmp_path / "node-b"), url,
         s3_server.endpoint],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert second.stdout.startswith("REFUSED"), second.stdout + second.stderr
    assert f"pid {holder.proc.pid}" in second.stdout and "mirror_takeover=True" in second.stdout
    remote = FsspecStorage(url, s3_server.storage_options)
    assert (claim := read_claim(remote)) is not None and claim.pid == holder.proc.pid
    holder.release()  # its session finishes: the claim stayed its own all along


def own_identity_claim(storage: FsspecStorage, **fields: Any) -> Claim:
    """A claim of another session written with this process's identity, changed by ``fields``."""
    me = ProcessIdentity.current()
    claim = Claim("other-session", "run-x", me.host, me.pid, "np", time.time(), 0, me.boot, me.pid_ns, me.started)
    claim = dataclasses.replace(claim, **fields)
    data = json.dumps(dataclasses.asdict(claim)).encode()
    storage.write_atomic(CLAIM_NAME, lambda f: f.write(data))
    return claim


@pytest.mark.skipif(ProcessIdentity.current().pid_ns is None, reason="needs Linux's /proc of this PID namespace")
@pytest.mark.parametrize(
    ("fields", "outcome"),
    [
        ({"pid": 1 << 22, "pid_started": 5}, "taken at once: no such process"),
        ({"pid": os.getppid()}, "watched: a live process of this PID space"),
        ({"pid": os.getppid(), "pid_started": 1}, "taken at once: the pid was reused"),
        ({"pid": os.getppid(), "pid_ns": "pid:[1]"}, "watched: another PID namespace"),
        ({"pid": 1 << 22, "boot": "another-boot"}, "watched: another boot"),
        ({"pid": 1 << 22, "boot": None, "pid_ns": None, "pid_started": None}, "watched: a claim without identity"),
    ],
)
def test_a_pid_is_trusted_only_in_the_same_host_boot_and_pid_namespace(fields: dict[str, Any], outcome: str) -> None:
    storage = memory_mirror()
    if "pid_started" not in fields and fields.get("pid") == os.getppid():
        fields["pid_started"] = start_ticks(os.getppid())
    own_identity_claim(storage, **fields)
    fake = FakeTime()
    claim = claim_on(storage, fake)
    claim.take(store_now=None)  # never renewed: a watched claim is taken after 45 s
    assert (fake.sleeps == 0) == outcome.startswith("taken at once"), outcome
    assert read_claim(storage).session == claim.session  # type: ignore[union-attr]
    claim.release()


def test_mirror_takeover_takes_a_claim_that_is_renewed(tmp_path: Path) -> None:
    url = f"memory://claims/{uuid.uuid4().hex[:8]}"
    storage = FsspecStorage(url)
    foreign_claim(storage)
    fake = FakeTime(lambda fake: foreign_claim(storage, beat=fake.sleeps))  # renewed while watched
    with pytest.raises(DirectoryLockedError, match="mirror_takeover=True"):
        claim_on(storage, fake).take(store_now=None)
    taker = MirrorClaim(storage, "np", lambda: "my-run", [].append, heartbeat_s=3600, take_over=True)
    taker.take(store_now=None)
    assert read_claim(storage).session == taker.session  # type: ignore[union-attr]
    taker.release()
    assert Config(dirpath=str(tmp_path), mirror=url, mirror_takeover="yes").mirror_takeover is True  # YAML's words
    with pytest.raises(ConfigError, match="mirror_takeover"):
        Config(dirpath=str(tmp_path), mirror=url, mirror_takeover="always")  # type: ignore[arg-type]
