"""Object storage: an fsspec URL ``dirpath`` with ``storage_options``, against a real
S3-compatible server (``moto.server`` started as its own process on 127.0.0.1; see
``tests/s3_server.py``).

What is checked: options reach the server; an upload that fails midway commits nothing (no
object under any name, no open multipart upload) and leaves the previous checkpoint newest;
while an upload is in flight a reader sees only the previous, complete checkpoint (the
manifest is written after the checkpoint object); retention deletes only after the new
manifest is up; ``autockpt inspect s3://...`` lists and verifies.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import IO, Any

import numpy as np
import pytest

from autockpt_core import CheckpointSession, Config, Snapshot
from autockpt_core.cli import main as cli_main
from autockpt_core.errors import CheckpointWriteError, ConfigError
from autockpt_core.persist import find_latest_valid, read_manifest
from autockpt_core.persist.manifest import MANIFEST_NAME
from autockpt_core.persist.storage import TEMP_PREFIX, FsspecStorage, fetched, storage_for
from autockpt_core.persist.tensorfile import write_tensor_file

MiB = 2**20
BLOCK = 5 * MiB  # S3's smallest multipart part: writes above it are multipart uploads


def fresh_prefix() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


def listing(server: Any, prefix: str) -> list[str]:
    fs = server.filesystem()
    try:
        return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{server.bucket}/{prefix}", detail=False))
    except FileNotFoundError:
        return []


def open_uploads(server: Any) -> list[Any]:
    return list(server.filesystem().list_multipart_uploads(server.bucket))


def test_storage_options_reach_the_server(s3_server: Any) -> None:
    prefix = fresh_prefix()
    storage = storage_for(s3_server.url(prefix), s3_server.storage_options)
    assert isinstance(storage, FsspecStorage) and storage.location == s3_server.url(prefix)
    result = storage.write_atomic("a.bin", lambda f: f.write(b"hello object store"))
    assert result.size == 18
    assert listing(s3_server, prefix) == ["a.bin"]  # seen by another client: on the server
    with storage.open_read("a.bin") as f:
        assert f.read() == b"hello object store"
    with fetched(s3_server.url(f"{prefix}/a.bin"), s3_server.storage_options) as local:
        with open(local, "rb") as f:
            assert f.read() == b"hello object store"
    storage.delete("a.bin")
    storage.delete("a.bin")  # a missing object is not an error
    assert not storage.exists("a.bin") and listing(s3_server, prefix) == []


def test_without_the_options_the_server_is_not_reached(s3_server: Any) -> None:
    storage = storage_for(s3_server.url(fresh_prefix()), {"endpoint_url": "http://127.0.0.1:9", "key": "x", "secret": "y",
                                                          "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}})
    with pytest.raises(Exception):
        storage.write_atomic("a.bin", lambda f: f.write(b"x"))


@pytest.mark.parametrize("size", [64 * 1024, 12 * MiB])  # one PUT; a multipart upload
def test_an_upload_that_fails_midway_commits_nothing(s3_server: Any, size: int) -> None:
    prefix = fresh_prefix()
    storage = storage_for(s3_server.url(prefix), {**s3_server.storage_options, "default_block_size": BLOCK})
    storage.write_atomic("a.bin", lambda f: f.write(b"old contents"))

    def half_then_fail(f: IO[bytes]) -> None:
        f.write(np.ones(size, dtype=np.uint8).tobytes())  # parts of a multipart upload go out here
        raise OSError("connection reset by peer")

    with pytest.raises(OSError, match="connection reset"):
        storage.write_atomic("a.bin", half_then_fail)
    assert listing(s3_server, prefix) == ["a.bin"]  # no temporary, no half object
    assert not [u for u in open_uploads(s3_server) if prefix in u["Key"]]  # the multipart upload was aborted
    with storage.open_read("a.bin") as f:
        assert f.read() == b"old contents"


def session_for(server: Any, prefix: str, **config: Any) -> CheckpointSession:
    cfg = Config(dirpath=server.url(prefix), storage_options=server.storage_options, every_n_steps=1000,
                 warmup_steps=0, **config)
    session = CheckpointSession(cfg, framework="np", suffix=".safetensors")
    session.start(0)
    return session


def snapshot_of(value: float, write_hook: Any = None) -> Any:
    def snapshot(pool: Any) -> Snapshot:
        buf = pool.get("w", (MiB // 4,), np.float32)  # 1 MiB
        buf[:] = value

        def write(f: IO[bytes]) -> int:
            if write_hook is not None:
                write_hook(f)
            return write_tensor_file(f, {"w": buf})

        return Snapshot(write=write, nbytes=buf.nbytes)

    return snapshot


def newest_value(server: Any, prefix: str) -> tuple[int, float] | None:
    """What a fresh reader (another process's view) finds newest: (step, value)."""
    storage = storage_for(server.url(prefix), server.storage_options)
    record = find_latest_valid(storage)
    if record is None:
        return None
    from autockpt_core.persist.tensorfile import read_tensor_file

    with storage.open_read(record.name) as f:
        arrays, _meta = read_tensor_file(f.read())
    return record.step, float(arrays["w"][0])


def test_a_reader_sees_only_complete_checkpoints_and_retention_waits_for_the_new_manifest(s3_server: Any) -> None:
    prefix = fresh_prefix()
    session = session_for(s3_server, prefix, keep_last=2)
    for step in (1, 2):
        session.save(step, 0, snapshot_of(float(step)))
        session.flush()
    assert newest_value(s3_server, prefix) == (2, 2.0)
    before = listing(s3_server, prefix)
    assert len([n for n in before if n.endswith(".safetensors")]) == 2

    uploading, release = threading.Event(), threading.Event()

    def hold(f: IO[bytes]) -> None:
        f.write(b"")  # the upload is open
        uploading.set()
        assert release.wait(30)

    session.save(3, 0, snapshot_of(3.0, hold))
    assert uploading.wait(30)
    # Mid-upload: the manifest still names steps 1 and 2, both there; nothing was deleted.
    assert newest_value(s3_server, prefix) == (2, 2.0)
    assert [r.step for r in read_manifest(storage_for(s3_server.url(prefix), s3_server.storage_options))] == [1, 2]
    assert set(before) <= set(listing(s3_server, prefix))
    release.set()
    session.flush()
    assert newest_value(s3_server, prefix) == (3, 3.0)
    after = listing(s3_server, prefix)
    assert len([n for n in after if n.endswith(".safetensors")]) == 2  # step 1 deleted after the manifest named 3
    assert MANIFEST_NAME in after and not [n for n in after if n.startswith(TEMP_PREFIX)]
    session.finish()


def test_a_failed_upload_keeps_the_previous_checkpoint_newest_and_names_the_url(s3_server: Any) -> None:
    prefix = fresh_prefix()
    session = session_for(s3_server, prefix)
    session.save(1, 0, snapshot_of(1.0))
    session.flush()

    def fail(f: IO[bytes]) -> None:
        f.write(b"\0" * 4096)
        raise OSError("upload interrupted")

    session.save(2, 0, snapshot_of(2.0, fail))
    with pytest.raises(CheckpointWriteError) as info:
        session.flush()
    message = str(info.value)
    assert s3_server.url(prefix) in message and "upload interrupted" in message, message
    assert newest_value(s3_server, prefix) == (1, 1.0)
    assert not [n for n in listing(s3_server, prefix) if n.startswith(TEMP_PREFIX)]
    session.finish()


def test_inspect_lists_and_verifies_an_s3_directory(s3_server: Any, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    prefix = fresh_prefix()
    session = session_for(s3_server, prefix)
    session.save(4, 0, snapshot_of(4.0))
    session.flush()
    session.finish()
    options = json.dumps(s3_server.storage_options)
    assert cli_main(["inspect", s3_server.url(prefix), "--json", "--storage-options", options]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["status"]) for r in rows] == [(4, "ok")]
    config = tmp_path / "autockpt.yaml"  # the callback's config file works as well
    config.write_text(json.dumps({"dirpath": s3_server.url(prefix), "storage_options": s3_server.storage_options}))
    assert cli_main(["inspect", s3_server.url(prefix), "--storage-options", str(config)]) == 0
    assert "step" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("dirpath", "options", "message"),
    [
        ("ckpts", {"endpoint_url": "http://127.0.0.1:1"}, "applies to fsspec URLs"),
        ("file:///tmp/x", {"anon": True}, "applies to fsspec URLs"),
        ("s3://b/r", ["endpoint_url"], "is not a mapping"),
        ("s3://b/r", {1: "x"}, "is not a mapping"),
    ],
)
def test_bad_storage_options_are_refused_by_name(dirpath: str, options: Any, message: str) -> None:
    with pytest.raises(ConfigError, match="storage_options") as info:
        Config(dirpath=dirpath, storage_options=options)
    assert message in str(info.value)


def test_a_large_tensor_reaches_an_fsspec_file_in_bounded_blocks(monkeypatch) -> None:
    """fsspec files copy what ``write`` gets into their upload buffer: a 40 MiB tensor written
    whole was held a second time there; it goes in blocks of at most UPLOAD_BLOCK bytes."""
    import fsspec.implementations.memory as memory

    from autockpt_core.persist.storage import UPLOAD_BLOCK

    sizes: list[int] = []
    original = memory.MemoryFile.write

    def spy(self, data):  # type: ignore[no-untyped-def]
        sizes.append(len(memoryview(data).cast("B")))
        return original(self, data)

    monkeypatch.setattr(memory.MemoryFile, "write", spy)
    payload = np.arange(10 * 1024 * 1024, dtype=np.float32)  # 40 MiB, one write call
    storage = storage_for("memory://autockpt-blocks")
    result = storage.write_atomic("big.bin", lambda f: f.write(memoryview(payload).cast("B")))
    assert result.size == payload.nbytes and max(sizes) <= UPLOAD_BLOCK and len(sizes) >= 5
    with storage.open_read("big.bin") as f:
        assert f.read() == payload.tobytes()
