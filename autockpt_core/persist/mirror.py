"""The mirror: each checkpoint committed in the fast tier, copied in the background to a second tier.

Node-local disks are fast and go with the node; object storage outlives it and is slow. The
session persists to the fast tier (``Config.dirpath``) as always, and the writer hands every
committed record to :meth:`Mirror.submit`. A mirror thread then, per record (see :mod:`.tiers`):

1. copies the file into the mirror (``Config.mirror``), atomically, checking size and checksum;
2. commits it in the mirror's own manifest (written last, so a reader of the mirror never sees
   a half-uploaded checkpoint);
3. applies the mirror's retention (``Config.mirror_keep_last``), only after that commit.

Latest wins: one upload runs at a time; records submitted meanwhile replace each other, so
a mirror slower than the checkpoint interval uploads the newest checkpoint next and skips
the ones in between (counted in ``superseded``). It never holds up training or the fast tier.
A record whose fast-tier file retention removed before its upload began is skipped the same way.

Threading: ``submit`` from any thread (the writer thread calls it); ``wait``, ``raise_if_failed``
and ``close`` from the training thread. Uploads run in a non-daemon thread, so an interpreter
that exits finishes the upload it started. A failed upload is stored and raised, once, in the
training thread as :class:`~autockpt_core.errors.CheckpointWriteError` by the next
``raise_if_failed`` or ``wait``: the checkpoint stays committed in the fast tier and the
mirror keeps its previous newest checkpoint. Retention problems come back as warnings.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from typing import Callable

from ..errors import CheckpointWriteError
from .manifest import CheckpointRecord, read_manifest
from .retention import retain
from .storage import Storage
from .tiers import copy_checkpoint

log = logging.getLogger("autockpt")


class Mirror:
    """Copies committed checkpoints from ``source`` (the fast tier) to ``target`` (the mirror).

    ``keep_last``: the mirror's retention, per framework and run, as the writer's.
    ``clock`` times each upload (``last_upload_s``); ``wall_clock`` stamps ``created``.
    """

    def __init__(
        self,
        source: Storage,
        target: Storage,
        keep_last: int,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.source = source
        self.target = target
        self._keep_last = keep_last
        self._clock = clock
        self._wall_clock = wall_clock
        self._cond = threading.Condition()
        self._pending: CheckpointRecord | None = None
        self._running = False
        self._failure: str | None = None
        self._cause: BaseException | None = None
        self._warnings: list[str] = []
        self.last_record: CheckpointRecord | None = None
        """The mirror's record of the newest checkpoint this mirror uploaded."""
        self.mirrored = 0
        self.superseded = 0
        self.last_upload_s: float | None = None

    @property
    def location(self) -> str:
        return self.target.location

    @property
    def busy(self) -> bool:
        """True while an upload runs or waits."""
        with self._cond:
            return self._running

    def submit(self, record: CheckpointRecord) -> None:
        """Queue ``record`` (committed in the fast tier) for upload; replaces one still waiting."""
        with self._cond:
            if self._pending is not None:
                self.superseded += 1
                log.info("autockpt: mirror skips %s (step %d): a newer checkpoint is committed",
                         self._pending.name, self._pending.step)  # fmt: skip
            self._pending = record
            if not self._running:
                self._running = True
                threading.Thread(target=self._loop, name="autockpt-mirror").start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted record is uploaded (or skipped); then raise a stored error.

        Returns False when ``timeout`` passed first (no error is raised then).
        """
        with self._cond:
            done = self._cond.wait_for(lambda: not self._running, timeout)
        if done:
            self.raise_if_failed()
        return done

    def raise_if_failed(self) -> None:
        """Issue stored retention warnings, then raise a stored upload failure; each once."""
        with self._cond:
            message, cause, self._failure, self._cause = self._failure, self._cause, None, None
            pending, self._warnings = self._warnings, []
        for text in pending:
            warnings.warn(text, RuntimeWarning, stacklevel=3)
        if message is not None:
            raise CheckpointWriteError(message) from cause

    def close(self) -> None:
        """Finish the uploads still to do and surface their error."""
        self.wait()

    # -- mirror thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                record, self._pending = self._pending, None
                if record is None:
                    self._running = False
                    self._cond.notify_all()
                    return
            try:
                self._upload(record)
            except BaseException as exc:  # stored, raised in the training thread
                with self._cond:
                    self._failure, self._cause = self._describe(record, exc), exc

    def _upload(self, record: CheckpointRecord) -> None:
        start = self._clock()
        try:
            copied, records = copy_checkpoint(self.source, self.target, record, self._wall_clock)
        except FileNotFoundError:
            if not any(r.name == record.name for r in read_manifest(self.source)):
                with self._cond:  # retention dropped it: a newer checkpoint is committed and submitted
                    self.superseded += 1
                return
            raise
        self.last_upload_s = self._clock() - start
        self.last_record = copied
        self.mirrored += 1
        log.info("autockpt: mirrored %s (step %d, %d bytes) to %s in %.2fs",
                 record.name, record.step, record.size, self.target.location, self.last_upload_s)  # fmt: skip
        problems = retain(self.target, copied, records, self._keep_last)
        for text in problems:
            log.warning(text)
        if problems:
            with self._cond:
                self._warnings.extend(problems)

    def _describe(self, record: CheckpointRecord, exc: BaseException) -> str:
        newest = self.last_record
        kept = (
            f"the mirror's newest checkpoint is still step {newest.step} ({newest.name})"
            if newest is not None
            else "the mirror holds no checkpoint of this session yet"
        )
        return (
            f"autockpt could not mirror checkpoint {record.name} (step {record.step}) from {self.source.location} "
            f"to {self.target.location}: {type(exc).__name__}: {exc}. The checkpoint is committed in "
            f"{self.source.location}; {kept}, and nothing of the failed upload is listed there. "
            "Fix: check that the mirror can be written (free space, permissions, the credentials in "
            "storage_options, the network); a rerun resumes from the newest checkpoint of either tier."
        )
