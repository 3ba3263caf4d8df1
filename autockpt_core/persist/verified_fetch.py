"""Downloading a checkpoint object once, verifying it on the way: a resume's only pass over a URL.

A loader that takes a local file (Lightning's: it opens a URL without the storage options) gets
a checkpoint under a URL ``dirpath`` as a local copy. Verifying the object and then downloading
it would read it over the network twice. :class:`FetchWhileVerifying` is a ``check`` for
``resume_record`` that copies each single-file candidate under a URL into a local directory,
counting and checksumming the bytes as they are written (:meth:`LocalStorage.write_atomic`:
its CRC-32 runs in a helper thread beside the writes), and keeps the copy of the one that
verified. A copy that does not match its record is removed and the next candidate is tried.

Records of local storage, multi-file records and other checksum algorithms are verified by
:func:`~.manifest.verify`, as without this check. The copies are not fsynced: they live for one
resume, and a process killed meanwhile leaves a temporary file or a copy named
``autockpt-fetched-*`` in the directory (the system's temporary directory by default), which
the next resume that fetches removes once it is a day old (:mod:`.fetched_copies`).

Call order (training thread): ``session.resume_record(check=fetches.check)``, then
``fetches.take(record)`` once for the record it returned (the local path, now the caller's to
remove; None when it was not fetched here), then :meth:`FetchWhileVerifying.discard` (in a
``finally``) for a copy nobody took.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid

from .checksum import checksum_mismatch, size_mismatch
from .fetched_copies import PREFIX, fetch_directory, remove_stale_copies
from .manifest import MISSING, CheckpointRecord, verify
from .storage import LocalStorage, Storage, location_of

log = logging.getLogger("autockpt")

BLOCK = 16 * 1024 * 1024
"""Bytes read from the object at a time."""



class FetchWhileVerifying:
    """A ``check`` for ``resume_record`` that downloads single-file candidates under a URL into
    ``directory`` while verifying them, and keeps the copy of the one that verified (see the
    module docstring). ``directory``: where the copies go (default: the temporary directory)."""

    def __init__(self, storage: Storage, directory: str | os.PathLike[str] | None = None) -> None:
        self.storage = storage
        self.directory = os.fspath(directory) if directory is not None else fetch_directory()
        self._cleaned = False  # stale copies are removed before the first download, once
        self._kept: tuple[str, str] | None = None

    def fetches(self, record: CheckpointRecord) -> bool:
        """Whether :meth:`check` downloads ``record`` (else it only verifies it)."""
        return record.files is None and record.algorithm == "crc32" and self.storage.local_path(record.name) is None

    def check(self, record: CheckpointRecord) -> str | None:
        """None when ``record``'s object matches its size and checksum (its local copy is then
        kept for :meth:`take`), else why not."""
        self.discard()  # at most one candidate's copy on disk
        if not self.fetches(record):
            return verify(self.storage, record)
        if not self._cleaned:
            self._cleaned = True
            remove_stale_copies(self.directory)  # left by resumes killed in their download or load
        start = time.perf_counter()
        try:
            source = self.storage.open_read(record.name)  # an object store's open asks for its size
        except FileNotFoundError:
            return MISSING
        target = LocalStorage(self.directory, fsync=False)
        name = f"{PREFIX}{uuid.uuid4().hex[:12]}-{record.name}"
        with source:
            result = target.write_atomic(name, lambda out: shutil.copyfileobj(source, out, BLOCK))
        path = os.path.join(self.directory, name)
        problem = size_mismatch(result.size, record.size) or checksum_mismatch(result.checksum, record.checksum)
        if problem is not None:
            target.delete(name)
            return problem
        log.info(
            "autockpt: downloaded %s (%d bytes) to %s in %.2fs",
            location_of(self.storage, record.name), result.size, path, time.perf_counter() - start,
        )  # fmt: skip
        self._kept = (record.name, path)
        return None

    def kept_path(self, record: CheckpointRecord) -> str | None:
        """The local copy of ``record`` if it is the one kept (still :meth:`take`'s to hand over)."""
        return self._kept[1] if self._kept is not None and self._kept[0] == record.name else None

    def take(self, record: CheckpointRecord) -> str | None:
        """The local copy of ``record`` (the caller removes it), once; None when it was not
        fetched here."""
        kept, self._kept = self._kept, None
        if kept is None:
            return None
        if kept[0] != record.name:
            self._kept = kept  # left for discard()
            return None
        return kept[1]

    def discard(self) -> None:
        """Remove a kept copy that was not taken."""
        kept, self._kept = self._kept, None
        if kept is not None:
            try:
                os.unlink(kept[1])
            except FileNotFoundError:
                pass
