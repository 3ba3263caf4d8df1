"""A checkpoint made of several files, committed as one directory (a sharded model: one file
per rank, plus the framework's metadata), under one manifest record.

Protocol (local storage only; the writer and the session drive it):

1. ``new_staging_directory(storage)`` (training thread, the rank that owns the session,
   before the snapshot): an empty ``.autockpt-tmp-<hex>`` directory in ``dirpath``, which
   every rank writes its files into (its path is broadcast by the adapter);
2. ``commit_file_set(storage, file_set, name)`` (writer thread): ``file_set.fill(path)``
   first (it waits until every rank's files are written and durable, adds its own, and may
   return the checksums the ranks computed of their files), then every other file is
   checksummed and fsync'ed, the directory fsync'ed and renamed to ``name``,
   and ``dirpath`` fsync'ed. The manifest record the writer then commits lists each file's
   size and CRC-32 (:attr:`WriteResult.files`), so a resume verifies every shard, and a
   reader never sees the directory under its final name before all of it is durable. A
   failure removes the staging directory; every existing checkpoint stays as it was.

Removal of a committed or left-over directory: ``LocalStorage.delete`` and
``cleanup_temporaries`` take directories as well as files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
import zlib
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .checksum import ALGORITHM, checksum_stream, mismatch
from .storage import TEMP_PREFIX, LocalStorage, Storage, WriteResult, fsync_directory

Checksums = Mapping[str, Sequence[Any]]
"""File path inside the directory -> [size, CRC-32], as the writers of those files computed them."""


@dataclasses.dataclass(frozen=True)
class FileSetWrite:
    """Phase 2 of a multi-file checkpoint: ``fill(path)`` completes the staging directory
    ``path`` (writer thread; it may wait for other ranks' writes and must raise on failure).

    ``fill`` may return the checksums of files it knows (each rank's writer computed its
    own, and made those files durable); the commit then reads only the other files (a file
    whose size differs from its entry is read too)."""

    path: Path
    fill: Callable[[Path], Checksums | None]


def new_staging_directory(storage: Storage) -> Path:
    """An empty, uniquely named staging directory in ``storage`` (local storage only).

    Raises ``ValueError`` for remote (fsspec) storage, which has no directory to rename.
    """
    root = _local(storage).root
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}"
    path.mkdir()
    return path


def _local(storage: Storage) -> LocalStorage:
    if not isinstance(storage, LocalStorage):
        raise ValueError(f"multi-file checkpoints need a local directory, not {storage.location}")
    return storage


def files_digest(files: dict[str, list[Any]]) -> str:
    """One CRC-32 over the sorted (name, size, CRC-32) list: the record's ``checksum``."""
    body = json.dumps(sorted([name, *entry] for name, entry in files.items())).encode("utf-8")
    return f"{zlib.crc32(body) & 0xFFFFFFFF:08x}"


def commit_file_set(storage: Storage, file_set: FileSetWrite, name: str) -> WriteResult:
    """Fill, checksum and fsync the staging directory, then rename it to ``name`` (see above).

    On failure the staging directory is removed and the error raised; after the rename, a
    failed fsync of ``dirpath`` raises ``NotDurableError`` (the directory is in place).
    """
    local = _local(storage)
    staging = file_set.path
    final = local.root / name
    try:
        known = file_set.fill(staging) or {}
        files = _checksum_and_sync(staging, local.fsync, known)
        if local.fsync:
            fsync_directory(staging)
        if final.exists():
            raise FileExistsError(f"{final} exists already; a checkpoint is never written over another")
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    local.sync_after_rename(name)
    return WriteResult(name, sum(size for size, _ in files.values()), files_digest(files), ALGORITHM, files)


def _checksum_and_sync(directory: Path, fsync: bool, known: Checksums) -> dict[str, list[Any]]:
    """Every regular file under ``directory``: relative path -> [size, CRC-32]. A file in
    ``known`` with the size given there keeps its entry (its writer checksummed and fsync'ed
    it); every other file is read, checksummed and fsync'ed here."""
    files: dict[str, list[Any]] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_dir():
            if fsync:
                fsync_directory(path)
            continue
        relative = path.relative_to(directory).as_posix()
        entry = known.get(relative)
        if entry is not None and len(entry) == 2 and entry[0] == path.stat().st_size:
            files[relative] = [int(entry[0]), str(entry[1])]
            continue
        with open(path, "rb") as f:
            digest, size = checksum_stream(f)
            if fsync:
                os.fsync(f.fileno())
        files[relative] = [size, digest]
    return files


def share_of(files: dict[str, list[Any]], index: int, count: int) -> dict[str, list[Any]]:
    """The files process ``index`` of ``count`` verifies at a resume, so that each file is read
    by one process: a rank's own shards (``__<rank>_<n>.distcp``, DCP's names) by that rank, the
    others spread over the processes by their sorted position."""
    mine: dict[str, list[Any]] = {}
    spread = 0
    for relative in sorted(files):
        owner = _shard_rank(relative)
        if owner is None or owner >= count:
            owner, spread = spread % count, spread + 1
        if owner == index:
            mine[relative] = files[relative]
    return mine


def _shard_rank(relative: str) -> int | None:
    stem, _, suffix = relative.rpartition(".")
    if suffix != "distcp" or "/" in relative or not stem.startswith("__"):
        return None
    rank, _, _ = stem[2:].partition("_")
    return int(rank) if rank.isdigit() else None


def verify_file_set(storage: Storage, name: str, files: dict[str, list[Any]], algorithm: str) -> str | None:
    """None when the directory ``name`` holds every listed file (of ``files``: all of a
    record's, or a process's :func:`share_of` them) with its size and checksum."""
    root = storage.local_path(name) if isinstance(storage, LocalStorage) else None
    if root is None or not os.path.isdir(root):
        return "directory missing"
    if algorithm != ALGORITHM:
        return f"unknown checksum algorithm {algorithm!r}"
    for relative, (size, digest) in sorted(files.items()):
        path = os.path.join(root, relative)
        if not os.path.isfile(path):
            return f"file {relative} missing"
        with open(path, "rb") as f:
            problem = mismatch(f, size, digest)
        if problem is not None:
            return f"{relative}: {problem}"
    return None
