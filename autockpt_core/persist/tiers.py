"""Two tiers of one job's checkpoints: a fast, node-local directory and a mirror that outlives the node.

The session writes to the fast tier (``Config.dirpath``); :class:`~.mirror.Mirror` copies each
committed checkpoint to the mirror (``Config.mirror``) with :func:`copy_checkpoint`. Each tier
has its own manifest, its own commit numbers (``seq``) and its own retention, so records of the
two tiers are matched by content (:func:`same_checkpoint`), never by name or number.

Which checkpoint a resume takes (:func:`newest_of_tiers`, training thread): the mirror is the
job's history; a node's fast tier may be ahead of it (checkpoints not uploaded yet) or behind
and on another branch (the job ran on other nodes since this one last wrote). So:

1. the mirror's newest valid checkpoint M (of the framework, taken by ``accept``);
2. if the fast tier lists M, it continued from M on this node: its newest valid checkpoint
   committed at or after M wins (M's local copy at worst, read without a download);
3. if it does not, but holds a valid checkpoint of M's run at a later step than M, this node
   trained that run further than the mirror has (uploads lag, and retention dropped M here
   once its upload was listed): the newest such checkpoint wins. Within a run, exact resume
   makes a step's state the same on every branch, so the later step is simply more work;
4. otherwise the fast tier is another branch or another run: M wins;
5. with no M (an empty or new mirror), the fast tier's newest valid checkpoint wins.

A mirror checkpoint that wins is first copied into the fast tier (:func:`hydrate`), so the
framework loads a local file and the checkpoints after it continue the fast tier's history.
The copy is the newest commit there, which is its own order too: by rule 3, the fast tier
holds no valid checkpoint of its run at a later step, so retention keeps it and the work
that follows it, never drops newer local work for it.
The copy is M's only read, and it checks M's size and checksum on the way: a corrupt or
missing M is skipped (``skip``) for the mirror's previous checkpoint.
Clocks decide nothing (machines disagree); commit order within a tier and content do.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection
from typing import IO, Callable

from .manifest import CheckpointRecord, commit_order, find_latest_valid, next_seq, read_manifest, write_manifest
from .names import free_name
from .storage import Storage

log = logging.getLogger("autockpt")

COPY_CHUNK = 16 * 1024 * 1024
"""Bytes read from the source tier at a time while copying a checkpoint."""


class UploadAbandoned(Exception):
    """A copy stopped by its ``cancelled`` callback (:func:`copy_checkpoint`); nothing is left of it."""


def same_checkpoint(a: CheckpointRecord, b: CheckpointRecord) -> bool:
    """True when ``a`` and ``b`` list the same checkpoint (in two tiers: names and ``seq`` may differ)."""
    return (a.step, a.size, a.checksum, a.algorithm, a.framework, a.run) == (
        b.step, b.size, b.checksum, b.algorithm, b.framework, b.run
    )  # fmt: skip


def copy_checkpoint(
    source: Storage,
    target: Storage,
    record: CheckpointRecord,
    wall_clock: Callable[[], float] = time.time,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[], None] | None = None,
) -> tuple[CheckpointRecord, list[CheckpointRecord]]:
    """Copy ``record``'s file from ``source`` to ``target`` and commit it in ``target``'s manifest.

    The copy keeps the name unless ``target`` has a file of that name (then ``-v2`` ...), is
    written atomically (see storage), and must match the record's size and checksum, or it is
    removed and ``ValueError`` raised (the source file changed after its commit). The record
    is appended to ``target``'s manifest with ``target``'s next ``seq``. A failure after the
    upload removes the unlisted copy. Returns the new record and the manifest's records (for
    retention). Runs in the calling thread; ``FileNotFoundError`` when the source file is gone.
    ``cancelled`` is asked between blocks and before the manifest is written: True stops the
    copy with :class:`UploadAbandoned` (the target's atomic write removes what it wrote, or the
    unlisted copy is deleted; nothing is listed). ``progress()`` is called after each block.
    """
    with source.open_read(record.name) as src:
        name = free_name(record.name, target.exists)

        def copy(out: IO[bytes]) -> None:
            while block := src.read(COPY_CHUNK):
                if cancelled is not None and cancelled():
                    raise UploadAbandoned(f"the copy of {record.name} to {target.location} was abandoned")
                out.write(block)
                if progress is not None:
                    progress()

        result = target.write_atomic(name, copy)
    try:
        if cancelled is not None and cancelled():
            raise UploadAbandoned(f"the copy of {record.name} to {target.location} was abandoned before its listing")
        if (result.size, result.checksum) != (record.size, record.checksum):
            raise ValueError(
                f"{record.name} in {source.location} no longer matches its manifest record "
                f"(size {result.size} != {record.size} or checksum {result.checksum} != {record.checksum}): "
                "the file changed after it was committed"
            )
        records = read_manifest(target)
        copied = dataclasses.replace(record, name=name, seq=next_seq(records), created=wall_clock())
        records = [r for r in records if r.name != name] + [copied]
        write_manifest(target, records)
    except BaseException:
        _remove_unlisted(target, name)
        raise
    return copied, records


def _remove_unlisted(target: Storage, name: str) -> None:
    """Delete the copy ``name`` that failed before its listing, unless ``target``'s manifest
    lists that name: an abandoned upload that came back late wrote the same bytes as the retry
    that replaced it, and must not delete the retry's listed file."""
    try:
        if any(r.name == name for r in read_manifest(target)):
            return
        target.delete(name)
    except Exception as exc:  # noqa: BLE001 - reported; the original error goes on
        log.warning("autockpt: could not remove the unlisted copy %s in %s: %s", name, target.location, exc)


def newest_of_tiers(
    fast: Storage,
    mirror: Storage,
    framework: str | None = None,
    accept: Callable[[CheckpointRecord], bool] | None = None,
    before: CheckpointRecord | None = None,
    skip: Collection[str] = (),
    mirrored: list[CheckpointRecord] | None = None,
    check: Callable[[CheckpointRecord], str | None] | None = None,
) -> tuple[CheckpointRecord | None, Storage | None]:
    """The checkpoint to resume from and the tier that holds it (see the module docstring).

    ``accept``: only records it returns True for count (a filter on content, both tiers).
    ``before``: a fast-tier record; only checkpoints committed before it count (in the
    mirror: before its copy there; none if the mirror has no copy of it). ``skip``: mirror
    records (by name) found corrupt or missing since. ``mirrored``: the mirror's manifest,
    when the caller has read it already (each read is a round trip to object storage).
    ``check``: verifies a fast-tier record in place of reading it here (see ``find_latest_valid``).

    A fast-tier record is verified (its file read; corrupt or missing files are skipped with a
    warning, as by ``find_latest_valid``). A mirror record is not: its file is read once, by
    :func:`hydrate`, which checks it while copying; the caller passes a record that failed
    there in ``skip`` and asks again. The mirror's files are never read when the fast tier
    wins. Raises ``ValueError`` for an unreadable manifest in either tier (nothing is guessed).
    """
    if mirrored is None:
        mirrored = read_manifest(mirror)
    fast_accept, mirror_accept = accept, accept
    if before is not None:
        fast_accept = committed_before(before, accept)
        twins = [r for r in mirrored if same_checkpoint(r, before)]
        mirror_accept = committed_before(twins[-1], accept) if twins else (lambda record: False)
    remote = next(
        (
            r for r in reversed(mirrored)
            if r.name not in skip and (framework is None or r.framework == framework)
            and (mirror_accept is None or mirror_accept(r))
        ),
        None,
    )  # fmt: skip
    if remote is None:
        local = find_latest_valid(fast, framework=framework, accept=fast_accept, check=check)
        return (local, fast) if local is not None else (None, None)
    matches = [r for r in read_manifest(fast) if same_checkpoint(r, remote)]
    if not matches:
        ahead = find_latest_valid(fast, framework=framework, accept=_later_in_run(remote, fast_accept), check=check)
        return (ahead, fast) if ahead is not None else (remote, mirror)
    since = commit_order(matches[-1])

    def continued(record: CheckpointRecord) -> bool:
        return commit_order(record) >= since and (fast_accept is None or fast_accept(record))

    local = find_latest_valid(fast, framework=framework, accept=continued, check=check)
    return (local, fast) if local is not None else (remote, mirror)


def _later_in_run(
    remote: CheckpointRecord, accept: Callable[[CheckpointRecord], bool] | None
) -> Callable[[CheckpointRecord], bool]:
    """A filter: fast-tier records of ``remote``'s run at a later step (and taken by ``accept``)."""
    return lambda r: r.run == remote.run and r.step > remote.step and (accept is None or accept(r))


def committed_before(
    record: CheckpointRecord, accept: Callable[[CheckpointRecord], bool] | None
) -> Callable[[CheckpointRecord], bool]:
    """A filter: records of ``record``'s tier committed before it (and taken by ``accept``)."""
    limit = commit_order(record)
    return lambda r: commit_order(r) < limit and (accept is None or accept(r))


def hydrate(mirror: Storage, fast: Storage, record: CheckpointRecord) -> CheckpointRecord:
    """Copy the mirror's ``record`` into the fast tier and list it there; returns the fast tier's record.

    Training thread, under the fast tier's lock (the session's ``open()``). A copy killed
    midway leaves a temporary or unlisted file the next resume removes.
    """
    start = time.perf_counter()
    copied, _ = copy_checkpoint(mirror, fast, record, wall_clock=lambda: record.created)
    log.info(
        "autockpt: copied checkpoint %s (step %d, %d bytes) from the mirror %s to %s in %.2fs",
        record.name, record.step, record.size, mirror.location, fast.location, time.perf_counter() - start,
    )  # fmt: skip
    return copied
