"""A checkpoint committed in a storage by hand (file and manifest record), for the tier tests."""

from __future__ import annotations

from autockpt_core.persist import LocalStorage, read_manifest
from autockpt_core.persist.manifest import CheckpointRecord, next_seq, write_manifest
from autockpt_core.persist.names import free_name


def commit(storage: LocalStorage, step: int, run: str = "run-a", framework: str = "toy") -> CheckpointRecord:
    """Write and list a checkpoint of ``step`` whose bytes depend on the step and run."""
    name = free_name(f"ckpt-step{step:09d}.bin", storage.exists)
    result = storage.write_atomic(name, lambda f: f.write(f"{run}:{step}".encode() * 100))
    records = read_manifest(storage)
    record = CheckpointRecord.from_write(result, step, 0, framework, seq=next_seq(records), run=run)
    write_manifest(storage, records + [record])
    return record
