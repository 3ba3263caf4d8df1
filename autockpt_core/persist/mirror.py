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

The fast tier keeps what the mirror still has to copy: the writer's retention spares the record
being uploaded and the one waiting (:meth:`Mirror.protected`) until their upload is listed or a
newer record replaces the waiting one. Uploads that lag the interval by ``keep_last`` checkpoints
or more thus cost the fast tier at most two checkpoint files beyond ``keep_last``, and never the
file an upload is reading. A rerun on the same node resumes its own newest checkpoint of the run
whenever that is ahead of the mirror's (:mod:`.tiers`).

Deadlines: every call on the mirror's storage (the copy, its listing, the retention) runs in a
thread of its own (:mod:`.watched_call`); an upload that makes no progress (no block written)
for ``stall_timeout`` seconds is a failed upload, and a retention that stalls is a warning. So
the mirror thread never hangs on a hung mount or a silent endpoint, and :meth:`Mirror.close`
returns once the uploads are done or the failure rules below stop them.

Failures (:class:`Mirror` arguments ``max_outage``, ``max_failures``): a failed upload is a
warning (logged, and a ``RuntimeWarning`` in the training thread, with the count and the age
of the mirror's newest upload) and is tried again after 1, 2, 4, ... seconds (at most 60; with
the newest checkpoint committed by then). Only a failure ``max_outage`` seconds after the last
successful upload (or the mirror's start), or, where set, ``max_failures`` failures in a row,
is an error: stored and raised, once, in the
training thread as :class:`~autockpt_core.errors.MirrorWriteError` by the next
``raise_if_failed`` or ``wait``. The checkpoint stays committed in the fast tier and the mirror
keeps its previous newest checkpoint.

Preemption (:meth:`Mirror.deliver`): the emergency checkpoint is committed in the fast tier
first; then an older upload still running is abandoned (its partial copy removed, nothing
listed) so this one goes next, and the training thread waits for it at most a bounded time.
Whatever the outcome, nothing is raised there: the result says which tier holds what.

The failure path (:meth:`Mirror.leave`, when training raised): no waiting and no more
retries; the upload in flight goes on while the process lives, and what the mirror lacks is
logged, so the training error surfaces at once.

Threading: ``submit`` from any thread (the writer thread calls it); ``wait``, ``deliver``,
``raise_if_failed``, ``close`` and ``leave`` from the training thread. Uploads run in a daemon thread:
``close()`` (the session's end) waits for them, and an upload that hangs in the network after
a preemption must not keep the process from exiting (an upload cut short leaves nothing listed
in the mirror). Retention problems come back as warnings.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import warnings
from collections.abc import Collection
from typing import Callable

from ..errors import MirrorWriteError
from ..units import format_duration
from .manifest import CheckpointRecord, read_manifest
from .retention import retain
from .storage import Storage
from .tiers import UploadAbandoned, copy_checkpoint, same_checkpoint
from .watched_call import CallStalled, Progress, call_watched

log = logging.getLogger("autockpt")

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0
STALL_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Delivery:
    """What :meth:`Mirror.deliver` found: ``uploaded``, else why not (``problem``)."""

    uploaded: bool
    problem: str | None = None


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
        max_failures: int | None = None,
        max_outage: float = 1800.0,
        retry_first_s: float = RETRY_FIRST_S,
        stall_timeout: float = STALL_TIMEOUT_S,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self._stall_s = stall_timeout
        self._max_failures = max_failures
        self._max_outage = max_outage
        self.retry_first_s = retry_first_s
        """The delay before the first retry (doubled for each failure in a row, at most 60 s)."""
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
        self.failed_uploads = 0
        """Uploads that failed (each retried, or the last one raised)."""
        self.last_upload_s: float | None = None
        self._failures_in_row = 0
        self._last_success = clock()
        self._current: CheckpointRecord | None = None
        self._abandon = False
        self._last_problem: str | None = None
        self._no_retries = False
        self._gave_up = False  # deliver() gave up on an upload: close() does not wait for it
        self._failed_record: CheckpointRecord | None = None  # the record of the stored failure
        self._stopped = False  # stop(): another session took the mirror

    def protected(self) -> Collection[str]:
        """Fast-tier names retention must keep (writer thread; no I/O): the record being uploaded
        (also between the retries of a failed upload) and the newest one waiting."""
        with self._cond:
            return {r.name for r in (self._current, self._pending) if r is not None}

    @property
    def location(self) -> str:
        return self.target.location

    @property
    def busy(self) -> bool:
        """True while an upload runs or waits."""
        with self._cond:
            return self._running

    def stop(self, message: str) -> None:
        """Stop uploading for good (any thread; another session took the mirror, see
        :mod:`.mirror_claim`): the upload in flight is abandoned, later records are not
        uploaded, and ``message`` is raised once in the training thread as ``MirrorWriteError``."""
        with self._cond:
            self._stopped, self._abandon, self._pending = True, True, None
            self._failure, self._cause, self._failed_record = message, None, None
            self._cond.notify_all()

    def submit(self, record: CheckpointRecord) -> None:
        """Queue ``record`` (committed in the fast tier) for upload; replaces one still waiting."""
        with self._cond:
            if self._stopped:
                return
            if self._pending is not None:
                self.superseded += 1
                log.info("autockpt: mirror skips %s (step %d): a newer checkpoint is committed",
                         self._pending.name, self._pending.step)  # fmt: skip
            self._pending, self._gave_up, self._no_retries = record, False, False
            if not self._running:
                self._running = True
                # A daemon: close() waits for the uploads, so only one deliver() gave up on (or one
                # left when a process ends without close()) is cut short at exit.
                threading.Thread(target=self._loop, name="autockpt-mirror", daemon=True).start()
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every submitted record is uploaded (or skipped); then raise a stored error.

        Returns False when ``timeout`` passed first (no error is raised then). Returns at once
        after :meth:`deliver` gave up on an upload (nothing was submitted since).
        """
        with self._cond:
            done = self._cond.wait_for(lambda: not self._running or self._gave_up, timeout)
        if done:
            self.raise_if_failed()
        return done

    def raise_if_failed(self) -> None:
        """Issue stored retention warnings, then raise a stored upload failure; each once."""
        with self._cond:
            message, cause, self._failure, self._cause = self._failure, self._cause, None, None
            self._failed_record = None
            pending, self._warnings = self._warnings, []
        for text in pending:
            warnings.warn(text, RuntimeWarning, stacklevel=3)
        if message is not None:
            raise MirrorWriteError(message) from cause

    def close(self) -> None:
        """Finish the uploads still to do and surface their error (bounded: each upload ends
        or fails within ``stall_timeout`` of no progress, and failures stop by the rules)."""
        self.wait()

    def leave(self) -> str | None:
        """Training failed: stop retrying and do not wait (training thread; never raises).
        Returns what the mirror lacks, for the log (None when it lacks nothing)."""
        with self._cond:
            self._no_retries = True
            self._failure, self._cause, self._failed_record, self._warnings = None, None, None, []
            missing = self._pending or self._current if self._running else None
            newest = self.last_record
        if missing is None:
            return None
        has = f"its newest is step {newest.step}" if newest is not None else "it holds no checkpoint of this session"
        return (
            f"autockpt: training failed; not waiting for the mirror {self.target.location}: it lacks step "
            f"{missing.step} ({missing.name}, committed in {self.source.location}; its upload goes on while "
            f"this process lives), {has}"
        )

    def deliver(self, record: CheckpointRecord, timeout: float) -> Delivery:
        """Preemption: get ``record`` (committed in the fast tier and submitted) into the mirror
        within ``timeout`` seconds, best effort (training thread; never raises).

        An older upload still running is abandoned first. A stored failure or a failure of this
        upload is reported in the result, not raised; retries stop. On a timeout the upload is
        abandoned, so the process can exit at once.
        """
        deadline = self._clock() + timeout
        with self._cond:
            if self._current is not None and self._current is not record and self._pending is record:
                self._abandon = True  # an older checkpoint's upload: the newest goes next
            self._no_retries = True  # the job is going away
            done = self._cond.wait_for(lambda: self._done_with(record), max(0.0, deadline - self._clock()))
            uploaded = self._uploaded(record)
            problem = self._failure if self._failed_record is record else self._last_problem
            self._failure, self._cause, self._failed_record = None, None, None
            if not done:
                problem = f"the upload did not finish within {timeout:g}s and was abandoned"
            if not uploaded:  # nothing more is tried, and close() does not wait (a submit undoes this)
                self._abandon, self._pending, self._gave_up = True, None, True
                self._cond.notify_all()
        if uploaded:
            return Delivery(True)
        return Delivery(False, problem or "the upload did not happen")

    # -- mirror thread ----------------------------------------------------------------------

    def _uploaded(self, record: CheckpointRecord) -> bool:
        """(under the lock) the mirror's newest upload is ``record`` (a copy keeps its content)."""
        return self.last_record is not None and same_checkpoint(self.last_record, record)

    def _done_with(self, record: CheckpointRecord) -> bool:
        """(under the lock) ``record`` was uploaded, failed for good, or nothing is left to do."""
        if self._uploaded(record):
            return True
        return (self._failure is not None and self._failed_record is record) or not self._running

    def _loop(self) -> None:
        while True:
            with self._cond:
                record, self._pending = self._pending, None
                if record is None:
                    self._running, self._current = False, None
                    self._cond.notify_all()
                    return
                self._current, self._abandon = record, False
            try:
                self._upload(record)
            except UploadAbandoned:
                log.info("autockpt: mirror upload of %s (step %d) abandoned", record.name, record.step)
            except BaseException as exc:  # retried, or stored and raised in the training thread
                self._failed(record, exc)
            else:
                with self._cond:
                    self._failures_in_row, self._last_success, self._last_problem = 0, self._clock(), None
                    self._cond.notify_all()

    def _failed(self, record: CheckpointRecord, exc: BaseException) -> None:
        """Mirror thread: count the failure; give up (stored error) or retry after a delay."""
        with self._cond:
            self.failed_uploads += 1
            self._failures_in_row += 1
            outage = self._clock() - self._last_success
            limit = 1 if self._no_retries else self._max_failures
            if (limit is not None and self._failures_in_row >= limit) or outage >= self._max_outage:
                why = (
                    f"{self._failures_in_row} failed upload(s) in a row"
                    if limit is not None and self._failures_in_row >= limit
                    else f"no successful upload for {outage:.0f}s"
                )
                self._failure, self._cause = self._describe(record, exc, why), exc
                self._failed_record, self._failures_in_row = record, 0  # reported: a new count starts
                self._cond.notify_all()
                return
            delay = min(RETRY_MAX_S, self.retry_first_s * 2 ** (self._failures_in_row - 1))
            newest = self.last_record
            has = (
                f"the mirror's newest is step {newest.step}, uploaded {format_duration(outage)} ago"
                if newest is not None
                else f"no upload of this session has reached the mirror yet ({format_duration(outage)} since it "
                "started)"
            )
            stops = f"{self._max_failures} failures in a row or " if self._max_failures is not None else ""
            text = (
                f"autockpt: upload {self._failures_in_row} of {record.name} (step {record.step}) to "
                f"{self.target.location} failed ({type(exc).__name__}: {exc}); trying again in {delay:g}s. "
                f"The checkpoint is committed in {self.source.location}; {has}. Training goes on and stops "
                f"after {stops}{format_duration(self._max_outage)} without a successful upload (mirror_max_outage)"
            )
            log.warning(text)
            self._warnings.append(text)
            self._last_problem = f"{type(exc).__name__}: {exc}"
            if self._pending is None:
                self._pending = record
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._abandon, delay)  # a newer record waits out the delay too

    def _upload(self, record: CheckpointRecord) -> None:
        start = self._clock()

        def copy(progress: Progress) -> tuple[CheckpointRecord, list[CheckpointRecord]]:
            return copy_checkpoint(
                self.source, self.target, record, self._wall_clock,
                cancelled=lambda: progress.abandoned or self._abandon, progress=progress.mark,
            )  # fmt: skip

        try:
            copied, records = call_watched(
                copy, self._stall_s, f"upload of {record.name} to {self.target.location}", self._clock,
                stop=lambda: self._abandon,
            )  # fmt: skip
        except CallStalled:
            if self._abandon:
                raise UploadAbandoned(f"the upload of {record.name} was abandoned") from None
            raise
        except FileNotFoundError:
            if not any(r.name == record.name for r in read_manifest(self.source)):
                with self._cond:  # retention dropped it: a newer checkpoint is committed and submitted
                    self.superseded += 1
                return
            raise
        self.last_upload_s = self._clock() - start
        self.mirrored += 1
        with self._cond:  # deliver() and the retention of the fast tier read these
            self.last_record = copied
        log.info("autockpt: mirrored %s (step %d, %d bytes) to %s in %.2fs",
                 record.name, record.step, record.size, self.target.location, self.last_upload_s)  # fmt: skip
        try:
            problems = call_watched(
                lambda progress: retain(self.target, copied, records, self._keep_last,
                                        cancelled=lambda: progress.abandoned),
                self._stall_s, f"retention in {self.target.location}", self._clock,
            )  # fmt: skip
        except CallStalled as exc:
            problems = [f"autockpt: checkpoint {copied.name} (step {copied.step}) is in the mirror, but its "
                        f"retention stalled ({exc}); older checkpoints there are kept for now"]  # fmt: skip
        for text in problems:
            log.warning(text)
        if problems:
            with self._cond:
                self._warnings.extend(problems)

    def _describe(self, record: CheckpointRecord, exc: BaseException, why: str) -> str:
        newest = self.last_record
        kept = (
            f"the mirror's newest checkpoint is still step {newest.step} ({newest.name})"
            if newest is not None
            else "the mirror holds no checkpoint of this session yet"
        )
        return (
            f"autockpt could not mirror checkpoint {record.name} (step {record.step}) from {self.source.location} "
            f"to {self.target.location} ({why}): {type(exc).__name__}: {exc}. The checkpoint is committed in "
            f"{self.source.location}; {kept}, and nothing of the failed upload is listed there. "
            "Fix: check that the mirror can be written (free space, permissions, the credentials in "
            "storage_options, the network); a rerun resumes from the newest checkpoint of either tier."
        )

