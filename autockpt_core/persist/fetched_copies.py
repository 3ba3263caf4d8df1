"""Local copies of checkpoints fetched from object storage for one resume, and their cleanup.

A resume under a URL ``dirpath`` (or a loader that opens only local files) downloads the
checkpoint into the system's temporary directory, named ``autockpt-fetched-*``; the copy is
removed once loaded. A process killed during the download or the load leaves it there (with a
``.autockpt-tmp-*`` file for a download cut short), and repeated preemptions would fill a
small ``/tmp``. So every resume that fetches first removes such copies older than
:data:`STALE_AFTER_S` (a day): older than any resume still loading, so the copies of other jobs
on the machine that are in use are left alone.

Any thread; the removal never raises (a copy that cannot be removed is logged).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time

from .storage import TEMP_PREFIX

log = logging.getLogger("autockpt")

PREFIX = "autockpt-fetched-"
"""The start of every local copy's name."""
STALE_AFTER_S = 24 * 3600.0
"""A fetched copy older than this is left from a process that is gone."""


def fetch_directory() -> str:
    """Where fetched copies go: the system's temporary directory."""
    return tempfile.gettempdir()


def remove_stale_copies(directory: str | None = None, older_than_s: float = STALE_AFTER_S) -> int:
    """Remove fetched copies (and their cut-short downloads) in ``directory`` (default:
    :func:`fetch_directory`) last modified more than ``older_than_s`` ago; returns how many."""
    directory = directory if directory is not None else fetch_directory()
    limit = time.time() - older_than_s
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError as exc:
        log.debug("autockpt: cannot list %s for stale fetched copies: %s", directory, exc)
        return 0
    for entry in entries:
        name = entry.name
        if not (name.startswith(PREFIX) or (name.startswith(TEMP_PREFIX) and PREFIX in name)):
            continue
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < limit:
                os.unlink(entry.path)
                removed += 1
        except OSError as exc:
            log.warning("autockpt: could not remove the stale fetched copy %s: %s", entry.path, exc)
    if removed:
        log.info("autockpt: removed %d fetched checkpoint copies older than %.0fh from %s",
                 removed, older_than_s / 3600, directory)  # fmt: skip
    return removed
