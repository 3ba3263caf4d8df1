"""The manifest: the list of committed checkpoints with sizes and checksums.

A checkpoint exists for autockpt once its entry is in the manifest; the manifest itself is
replaced atomically (see storage), after the checkpoint file is durable. Files not listed are
ignored (never deleted). ``find_latest_valid`` verifies checksums newest-first and skips torn
or corrupt files with a warning, so a bad newest checkpoint falls back to the previous one.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from typing import Any, Callable, Iterable

from .checksum import checksum_stream
from .storage import Storage, WriteResult

MANIFEST_NAME = "autockpt-manifest.json"
FORMAT = "autockpt-manifest"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class CheckpointRecord:
    """One committed checkpoint."""

    name: str
    step: int
    epoch: int | None
    created: float
    size: int
    checksum: str
    algorithm: str
    framework: str
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_write(
        cls,
        result: WriteResult,
        step: int,
        epoch: int | None,
        framework: str,
        meta: dict[str, Any] | None = None,
        created: float | None = None,
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
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckpointRecord":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def commit_order(record: CheckpointRecord) -> tuple[float, int]:
    """Sort key: when the checkpoint was committed, then its step."""
    return (record.created, record.step)


def read_manifest(storage: Storage) -> list[CheckpointRecord]:
    """Records in the manifest in commit order (oldest first); an absent manifest is an empty list.

    Commit order (creation time, then step) and not step order decides "newest": a run started
    with ``resume=False`` in a directory that holds an older run's higher-step checkpoints must
    resume from its own checkpoints, and retention must not delete them.

    An unreadable manifest raises ``ValueError`` (it is never silently treated as empty, which
    would let retention delete checkpoints the user still has).
    """
    if not storage.exists(MANIFEST_NAME):
        return []
    with storage.open_read(MANIFEST_NAME) as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
        if data.get("format") != FORMAT:
            raise ValueError(f"not an autockpt manifest (format={data.get('format')!r})")
        records = [CheckpointRecord.from_json(r) for r in data["checkpoints"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read {MANIFEST_NAME} in {storage.location}: {exc}") from exc
    return sorted(records, key=commit_order)


def write_manifest(storage: Storage, records: Iterable[CheckpointRecord]) -> None:
    """Atomically replace the manifest with ``records``."""
    ordered = sorted(records, key=commit_order)
    body = json.dumps(
        {"format": FORMAT, "version": VERSION, "checkpoints": [r.to_json() for r in ordered]},
        indent=1,
    ).encode("utf-8")
    storage.write_atomic(MANIFEST_NAME, lambda f: f.write(body))


def verify(storage: Storage, record: CheckpointRecord) -> str | None:
    """None when the file matches its record, else a reason ("missing", "size ...", ...)."""
    if not storage.exists(record.name):
        return "file missing"
    if record.algorithm != "crc32":
        return f"unknown checksum algorithm {record.algorithm!r}"
    with storage.open_read(record.name) as f:
        digest, size = checksum_stream(f)
    if size != record.size:
        return f"size {size} != {record.size} in manifest (truncated or torn file)"
    if digest != record.checksum:
        return f"checksum {digest} != {record.checksum} in manifest (corrupt file)"
    return None


def find_latest_valid(
    storage: Storage, framework: str | None = None, accept: Callable[[CheckpointRecord], bool] | None = None
) -> CheckpointRecord | None:
    """The newest checkpoint whose file verifies; corrupt newer ones are skipped with a warning.

    ``accept``: only records it returns True for are considered (checked before verifying).
    """
    for record in reversed(read_manifest(storage)):
        if framework is not None and record.framework != framework:
            continue
        if accept is not None and not accept(record):
            continue
        problem = verify(storage, record)
        if problem is None:
            return record
        warnings.warn(
            f"autockpt: skipping checkpoint {record.name} (step {record.step}) in "
            f"{storage.location}: {problem}; falling back to an older checkpoint",
            RuntimeWarning,
            stacklevel=2,
        )
    return None
