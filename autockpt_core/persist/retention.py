"""Retention: drop a run's oldest checkpoints beyond ``keep_last``, after a newer one is committed.

:func:`retain` is the third step of a persist (the writer, :mod:`.writer`) and of a mirror
upload (:mod:`.mirror`), in the thread that committed ``record``: it counts the records of
``record``'s framework and run (other runs' records are never dropped), rewrites the manifest
without the oldest of them, then deletes their files. The manifest goes first, so a crash in
between leaves unlisted files (removed by the next resume in a local directory), never a
listed record without its file. Nothing here raises: the new checkpoint is committed already,
so each problem comes back as a warning message naming what is kept.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Callable

from .manifest import CheckpointRecord, commit_order, write_manifest
from .storage import NotDurableError, Storage, location_of


def retain(
    storage: Storage,
    record: CheckpointRecord,
    records: list[CheckpointRecord],
    keep_last: int,
    keep: Collection[str] = (),
    cancelled: Callable[[], bool] | None = None,
) -> list[str]:
    """Apply ``keep_last`` to ``records`` (the manifest just written, ``record`` newest in it).

    ``keep``: names never dropped here, even beyond ``keep_last`` (what the mirror still has to
    upload, see :meth:`.mirror.Mirror.protected`). ``cancelled()`` True before the manifest is
    rewritten drops nothing (the caller stopped waiting for this call). Returns the warnings
    (empty when all went well); the caller issues them in the training thread.
    """
    same = [r for r in records if r.framework == record.framework and r.run == record.run]
    if len(same) <= keep_last:
        return []
    dropped = [r for r in sorted(same, key=commit_order)[:-keep_last] if r.name not in keep]
    if not dropped:
        return []
    names = {r.name for r in dropped}
    if cancelled is not None and cancelled():
        return []
    committed = f"checkpoint {record.name} (step {record.step}) is committed"
    try:
        write_manifest(storage, [r for r in records if r.name not in names])
    except NotDurableError as exc:  # unlisted now, maybe listed again after a power loss
        return [
            f"autockpt: {committed}; retention dropped {len(dropped)} older record(s) from the manifest "
            f"in {storage.location} but could not make it durable ({exc}); their files are kept, "
            "unlisted (a later resume in this directory removes them)"
        ]
    except Exception as exc:  # noqa: BLE001 - committed already: a warning, not an error
        return [
            f"autockpt: {committed}, but retention could not update the manifest in "
            f"{storage.location} ({type(exc).__name__}: {exc}); no older checkpoint was "
            f"deleted, so more than keep_last={keep_last} are kept"
        ]
    problems = []
    for old in dropped:
        try:
            storage.delete(old.name)
        except Exception as exc:  # noqa: BLE001 - committed already: a warning, not an error
            problems.append(
                f"autockpt: {committed}, but retention could not delete the older checkpoint "
                f"{location_of(storage, old.name)} (step {old.step}): {type(exc).__name__}: "
                f"{exc}. It is no longer listed and never used; delete it to free the space"
            )
    return problems
