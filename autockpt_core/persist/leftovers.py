"""What interrupted writes leave in a directory, removed when a session resumes there.

- temporary files and staging directories (``.autockpt-tmp-*``): a write killed before its rename;
- orphans: checkpoint files (or directories: a sharded model's, :mod:`.file_set`) of
  autockpt's own naming (``ckpt-step<9 digits>(-vN)<suffix>``) that the manifest does not list: a process killed between the rename and the manifest
  write, or a file retention dropped from the manifest but could not delete.

Call :func:`remove_leftovers` only while holding the directory lock (:mod:`.lock`): then no live
writer exists, and none of these files can be one's work in progress. Training thread.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .manifest import MANIFEST_NAME, read_manifest
from .names import is_checkpoint_name
from .storage import Storage

log = logging.getLogger("autockpt")


def remove_leftovers(storage: Storage, directory: Path, suffix: str) -> list[str]:
    """Remove temporaries and orphans with ``suffix`` in ``directory``; returns the orphans removed.

    A manifest that cannot be read raises ``ValueError`` before anything is removed. Without
    a manifest nothing is known to be unlisted: only temporaries are removed. An orphan that
    cannot be deleted is logged and left.
    """
    listed = {r.name for r in read_manifest(storage)} if storage.exists(MANIFEST_NAME) else None
    temporaries = storage.cleanup_temporaries()
    if temporaries:
        log.info("autockpt: removed %d temporary file(s) left by an interrupted write", temporaries)
    if listed is None:
        return []
    removed = []
    for name in sorted(os.listdir(directory)):
        if name in listed or not is_checkpoint_name(name, suffix) or not (directory / name).exists():
            continue
        try:
            storage.delete(name)
        except OSError as exc:
            log.warning("autockpt: could not remove the unlisted checkpoint file %s: %s", directory / name, exc)
            continue
        removed.append(name)
    if removed:
        log.info(
            "autockpt: removed %d checkpoint file(s) the manifest does not list (left by an interrupted write): %s",
            len(removed),
            ", ".join(removed),
        )
    return removed
