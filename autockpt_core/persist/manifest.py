"""The manifest: the list of committed checkpoints with sizes and checksums.

A checkpoint exists for autockpt once its entry is in the manifest; the manifest itself is
replaced atomically (see storage), after the checkpoint file is durable. ``find_latest_valid``
verifies checksums newest-first and skips torn or corrupt files with a warning, so a bad
newest checkpoint falls back to the previous one.

Order: every record carries ``seq``, the commit sequence number (the writer gives a new record
the largest ``seq`` in the manifest plus one). "Newest" and retention follow ``seq``, never the
wall clock (``created`` is information only: clocks of different machines disagree). Records
also carry ``run``, the id of the run that wrote them (retention counts per framework and run).
Version 1 manifests have neither: they read with ``seq`` numbered in their old (created, step)
order and ``run`` None.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from typing import Any, Callable, Iterable

from .checksum import mismatch, size_mismatch
from .file_set import verify_file_set
from .storage import Storage, WriteResult

MANIFEST_NAME = "autockpt-manifest.json"
FORMAT = "autockpt-manifest"
VERSION = 2
"""Version 2 added ``seq`` and ``run`` to the records; version 1 manifests still read."""


@dataclasses.dataclass(frozen=True)
class CheckpointRecord:
    """One committed checkpoint.

    ``seq``: commit sequence number, 1 and up (0 only while a version 1 record is read, before
    :func:`read_manifest` numbers it). ``run``: id of the run that wrote it (None: written
    before run ids, or by a run that continues such records). ``files``: a checkpoint written
    as a directory of files (a sharded model, :mod:`.file_set`) lists each file's path inside
    it -> [size, checksum]; None (and absent from the JSON) for a single file.
    """

    name: str
    step: int
    epoch: int | None
    created: float
    size: int
    checksum: str
    algorithm: str
    framework: str
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    seq: int = 0
    run: str | None = None
    files: dict[str, list[Any]] | None = None

    @classmethod
    def from_write(
        cls,
        result: WriteResult,
        step: int,
        epoch: int | None,
        framework: str,
        meta: dict[str, Any] | None = None,
        created: float | None = None,
        seq: int = 0,
        run: str | None = None,
    ) -> "CheckpointRecord":
        return cls(
            name=result.name,
            step=step,
            epoch=epoch,
            created=time.time() if created is None else created,
            size=result.size,
            checksum=result.checksum,
            algorithm=result.algorithm,
            framework=framework,
            meta=dict(meta or {}),
            seq=seq,
            run=run,
            files=dict(result.files) if result.files is not None else None,
        )

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.files is None:
            del data["files"]  # single-file records read the same by older versions
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckpointRecord":
        names = {f.name for f in dataclasses.fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in names})
        if isinstance(record.seq, bool) or not isinstance(record.seq, int) or record.seq < 0:
            raise ValueError(f"record {record.name!r} has seq={record.seq!r}; expected a whole number >= 1")
        return record


def commit_order(record: CheckpointRecord) -> tuple[int, float, int]:
    """Sort key: the commit sequence number (``created`` and step only break ties)."""
    return (record.seq, record.created, record.step)


def next_seq(records: Iterable[CheckpointRecord]) -> int:
    """The ``seq`` of the next record committed after ``records``."""
    return max((r.seq for r in records), default=0) + 1


def read_manifest(storage: Storage) -> list[CheckpointRecord]:
    """Records in the manifest in commit order (oldest first); an absent manifest is an empty list.

    Commit order (``seq``) and not step order decides "newest": a run started with
    ``resume=False`` in a directory that holds an older run's higher-step checkpoints must
    resume from its own checkpoints. Records of a version 1 manifest get ``seq`` numbers in
    their (created, step) order, before any numbered record.

    An unreadable manifest (not JSON, not an autockpt manifest, entries of the wrong shape)
    raises ``ValueError``: it is never silently treated as empty, which would let retention
    delete checkpoints the user still has.
    """
    if not storage.exists(MANIFEST_NAME):
        return []
    with storage.open_read(MANIFEST_NAME) as f:
        raw = f.read()
    try:
        return _in_commit_order(_parse(raw))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read {MANIFEST_NAME} in {storage.location}: {exc}") from exc


def _parse(raw: bytes) -> list[CheckpointRecord]:
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict):  # TypeError and ValueError both become read_manifest's ValueError
        raise TypeError(f"expected a JSON object, found {type(data).__name__} {data!r:.40}")
    if data.get("format") != FORMAT:
        raise ValueError(f"not an autockpt manifest (format={data.get('format')!r})")
    entries = data.get("checkpoints")
    if not isinstance(entries, list):
        raise TypeError(f"'checkpoints' is {type(entries).__name__}, not a list")
    records = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise TypeError(f"checkpoint entry {i} is {type(entry).__name__}, not an object")
        records.append(CheckpointRecord.from_json(entry))
    return records


def _in_commit_order(records: list[CheckpointRecord]) -> list[CheckpointRecord]:
    """Sorted by ``seq``; version 1 records (seq 0) numbered first, in (created, step) order."""
    if all(r.seq > 0 for r in records):
        return sorted(records, key=commit_order)
    legacy = sorted((r for r in records if r.seq == 0), key=lambda r: (r.created, r.step))
    numbered = sorted((r for r in records if r.seq > 0), key=commit_order)
    return [dataclasses.replace(r, seq=i) for i, r in enumerate(legacy + numbered, start=1)]


def write_manifest(storage: Storage, records: Iterable[CheckpointRecord]) -> None:
    """Atomically replace the manifest with ``records``.

    Records without a ``seq`` (0) are numbered after the others, in the order given.
    """
    records = list(records)
    seq = next_seq(records)
    numbered = []
    for record in records:
        if record.seq == 0:
            record, seq = dataclasses.replace(record, seq=seq), seq + 1
        numbered.append(record)
    body = json.dumps(
        {
            "format": FORMAT,
            "version": VERSION,
            "checkpoints": [r.to_json() for r in sorted(numbered, key=commit_order)],
        },
        indent=1,
    ).encode("utf-8")
    storage.write_atomic(MANIFEST_NAME, lambda f: f.write(body))


MISSING = "file missing"
"""Why a listed checkpoint is not verified when its file is not there."""


def verify(storage: Storage, record: CheckpointRecord) -> str | None:
    """None when the file matches its record, else a reason ("missing", "size ...", ...).

    A multi-file record (``files``) is verified file by file (:func:`.file_set.verify_file_set`).
    """
    if record.files is not None:
        return verify_file_set(storage, record.name, record.files, record.algorithm)
    if not storage.exists(record.name):
        return MISSING
    if record.algorithm != "crc32":
        return f"unknown checksum algorithm {record.algorithm!r}"
    with storage.open_read(record.name) as f:
        return mismatch(f, record.size, record.checksum)


def local_size_problem(path: str, record: CheckpointRecord) -> str | None:
    """Why the local file at ``path`` cannot hold ``record``, found without reading it (missing,
    another size), or None. A resume's single pass checks this before it reads the file."""
    try:
        found = os.path.getsize(path)
    except FileNotFoundError:
        return MISSING
    return size_mismatch(found, record.size)


def find_latest_valid(
    storage: Storage,
    framework: str | None = None,
    accept: Callable[[CheckpointRecord], bool] | None = None,
    check: Callable[[CheckpointRecord], str | None] | None = None,
) -> CheckpointRecord | None:
    """The newest checkpoint whose file verifies; corrupt newer ones are skipped with a warning.

    ``accept``: only records it returns True for are considered (checked before verifying).
    ``check``: verifies a record in place of :func:`verify` (None when it is intact, else why not).
    """
    for record in reversed(read_manifest(storage)):
        if framework is not None and record.framework != framework:
            continue
        if accept is not None and not accept(record):
            continue
        problem = check(record) if check is not None else verify(storage, record)
        if problem is None:
            return record
        warn_skipped(record, storage.location, problem, stacklevel=3)
    return None


def warn_skipped(record: CheckpointRecord, location: str, problem: object, stacklevel: int = 2) -> None:
    """The ``RuntimeWarning`` for a listed checkpoint that a resume passes over (corrupt, missing)."""
    warnings.warn(
        f"autockpt: skipping checkpoint {record.name} (step {record.step}) in {location}: {problem}; "
        "falling back to an older checkpoint",
        RuntimeWarning,
        stacklevel=stacklevel + 1,
    )
