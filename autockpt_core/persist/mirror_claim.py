"""One writer per mirror: two runs sharing ``Config.mirror`` would resume each other's
checkpoints and compete over its newest record, so a session takes the mirror when it opens.

- A local mirror directory is locked as ``dirpath`` is (:mod:`.lock`, field ``mirror``).
- A URL mirror (object storage has no locks) gets a claim object, :data:`CLAIM_NAME`: JSON
  naming the session, its run, framework and process (host, pid, boot id, PID namespace and
  start time: :mod:`.process_identity`), and a heartbeat count that the holder rewrites every
  :data:`HEARTBEAT_S` seconds from a daemon thread. The claim is a lease, not a lock.

Taking a URL mirror (:meth:`MirrorClaim.take`, training thread, in ``CheckpointSession.open``
after the mirror's write probe): no claim, or this session's own, is taken at once. Another
session's claim is taken over when that session is gone: a process that no longer runs, where
its pid can be looked up here (same host, boot and PID namespace; a pid reused by a later
process does not count), a session of this process that was closed or collected, or a claim
not renewed for :data:`STALE_AFTER_S` seconds, judged by the store's own clock (the claim's
modification time against the probe's, so machines' clocks never compare) or, where the store
cannot tell, by watching it that long. Every other claim (another host, another container's
PID namespace) is judged that way. A claim renewed while watched is a live run:
:class:`~autockpt_core.errors.DirectoryLockedError` names it and the fix, unless
``take_over`` (``Config.mirror_takeover``) takes it anyway; its holder stops uploading at its
next heartbeat.

Holding it: each heartbeat reads the claim first; finding another session's claim there (two
sessions that started at the same moment, or a holder cut off from the store for longer than
:data:`STALE_AFTER_S`) calls ``on_lost`` (the session stops its mirror, which raises
``MirrorWriteError`` in the training thread) and stops. A failed heartbeat is logged and tried
again at the next beat. ``release()`` (session close) stops the thread and deletes the claim
if it is still this session's. Limits: a claim is not a lock (the store has no compare-and-swap
here), so two sessions starting within one heartbeat may both write until the next beat, when
one of them stops; the claim is per mirror location, not per framework.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import threading
import time
import uuid
import weakref
from typing import Callable

from ..errors import DirectoryLockedError
from .lock import DirectoryLock, lock_directory
from .process_identity import ProcessIdentity, still_running
from .storage import Storage, modified_time

log = logging.getLogger("autockpt")

CLAIM_NAME = "autockpt.claim"
HEARTBEAT_S = 10.0
"""How often the holder of a URL mirror renews its claim."""
STALE_AFTER_S = 45.0
"""A claim not renewed for this long belongs to a session that is gone."""
RELEASE_WAIT_S = 5.0
"""The longest a session's close waits to remove its claim."""
_WATCH_POLL_S = 1.0

_live_sessions: weakref.WeakValueDictionary[str, MirrorClaim] = weakref.WeakValueDictionary()
"""Claims held by sessions of this process, by session id."""


@dataclasses.dataclass(frozen=True)
class Claim:
    """What :data:`CLAIM_NAME` holds."""

    session: str
    run: str | None
    host: str
    pid: int
    framework: str
    started: float
    beat: int = 0
    boot: str | None = None
    pid_ns: str | None = None
    pid_started: int | None = None
    """The holder's boot id, PID namespace and start time (:mod:`.process_identity`); None in
    claims of older versions or from systems without them."""

    def describe(self) -> str:
        run = f"run {self.run}, " if self.run else ""
        return f"{run}host {self.host}, pid {self.pid}, framework {self.framework!r}"


_CLAIM_FIELDS = frozenset(f.name for f in dataclasses.fields(Claim))


def read_claim(storage: Storage, attempts: int = 5) -> Claim | None:
    """The claim in ``storage``; None when there is none or it cannot be parsed (a torn write).

    A claim rewritten while it is read (s3fs: the object's ETag changed between its lookup and
    its read) is read again, up to ``attempts`` times.
    """
    for attempt in range(attempts):
        try:
            with storage.open_read(CLAIM_NAME) as f:
                data = json.loads(f.read().decode("utf-8"))
            return Claim(**{k: v for k, v in data.items() if k in _CLAIM_FIELDS})
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, UnicodeDecodeError):
            return None
        except OSError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    return None  # pragma: no cover - the loop returns or raises


class MirrorClaim:
    """This session's claim on a URL mirror (see the module docstring). Training thread, except
    the heartbeat (its own daemon thread)."""

    def __init__(
        self,
        storage: Storage,
        framework: str,
        run: Callable[[], str | None],
        on_lost: Callable[[str], None],
        heartbeat_s: float | None = None,
        stale_after_s: float | None = None,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        take_over: bool = False,
    ) -> None:
        self.storage = storage
        self.release_wait_s = RELEASE_WAIT_S
        self._me = ProcessIdentity.current()
        self._take_over = take_over
        self.session = uuid.uuid4().hex
        self._framework = framework
        self._run = run
        self._on_lost = on_lost
        self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        self.stale_after_s = STALE_AFTER_S if stale_after_s is None else stale_after_s
        self._sleep = sleep
        self._clock = clock
        self._beat = 0
        self._started = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one write of the claim at a time (heartbeat, release)
        self.lost: str | None = None
        """Why the claim was lost while held (another session took it), if it was."""

    def take(self, store_now: float | None = None) -> None:
        """Claim the mirror or raise ``DirectoryLockedError`` (field ``mirror``); then start the
        heartbeat. ``store_now``: the store's clock a moment ago (the probe's modification time)."""
        found = read_claim(self.storage)
        if found is not None and found.session != self.session and not self._gone(found, store_now):
            if self._take_over:
                log.warning("autockpt: taking over the mirror %s from %s (mirror_takeover=True); that run stops "
                            "uploading at its next heartbeat", self.storage.location, found.describe())  # fmt: skip
            else:
                self._watch(found)
        self._write()
        _live_sessions[self.session] = self
        self._thread = threading.Thread(target=self._heartbeat, name="autockpt-mirror-claim", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop the heartbeat; delete the claim if it is still this session's, waiting at most
        ``release_wait_s`` (:data:`RELEASE_WAIT_S`, less when a preempted job must exit sooner:
        an unreachable store must not hold up the exit; the claim left then expires). Idempotent."""
        self._stop.set()
        _live_sessions.pop(self.session, None)
        thread, self._thread = self._thread, None
        if thread is None or self.lost is not None:
            return
        remover = threading.Thread(target=self._remove, name="autockpt-mirror-release", daemon=True)
        remover.start()
        remover.join(self.release_wait_s)
        if remover.is_alive():
            log.warning("autockpt: the mirror claim %s/%s could not be removed within %.1fs; the next run "
                        "takes it over once it is stale", self.storage.location, CLAIM_NAME, self.release_wait_s)  # fmt: skip

    def _remove(self) -> None:
        with self._lock:  # after a heartbeat in flight
            try:
                found = read_claim(self.storage)
                if found is not None and found.session == self.session:
                    self.storage.delete(CLAIM_NAME)
            except Exception as exc:  # noqa: BLE001 - a claim left only delays the next run
                log.warning("autockpt: could not remove the mirror claim %s/%s: %s",
                            self.storage.location, CLAIM_NAME, exc)  # fmt: skip

    # -- taking ---------------------------------------------------------------------------------

    def _gone(self, found: Claim, store_now: float | None) -> bool:
        """Whether ``found``'s session is known to be gone without waiting."""
        if self._me.shares_pid_space(found.host, found.boot, found.pid_ns):
            if self._me.is_process(found.pid, found.pid_started):
                return found.session not in _live_sessions
            if not still_running(found.pid, found.pid_started):
                log.info("autockpt: the mirror's claim by %s is left from a process that ended; taking it over",
                         found.describe())  # fmt: skip
                return True
            return False
        if store_now is None:  # the store cannot tell its time: watch the claim instead
            return False
        renewed = modified_time(self.storage, CLAIM_NAME)
        if renewed is not None and store_now - renewed >= self.stale_after_s:
            log.info("autockpt: the mirror's claim by %s was last renewed %.0fs ago; taking it over",
                     found.describe(), store_now - renewed)  # fmt: skip
            return True
        return False

    def _watch(self, found: Claim) -> None:
        """Wait until ``found`` is renewed (a live run: raise) or stale (taken over)."""
        if self._in_this_process(found):
            gc.collect()  # an unreachable session of this process releases its claim when collected
            if found.session in _live_sessions:
                raise self._refusal(found, "in this process")
            return
        log.warning(
            "autockpt: the mirror %s is claimed by %s; waiting up to %.0fs to see whether that run is alive",
            self.storage.location, found.describe(), self.stale_after_s,
        )  # fmt: skip
        deadline = self._clock() + self.stale_after_s
        while self._clock() < deadline:
            self._sleep(min(_WATCH_POLL_S, max(0.0, deadline - self._clock())))
            now = read_claim(self.storage)
            if now is None:
                return  # released meanwhile
            if (now.session, now.beat) != (found.session, found.beat):
                raise self._refusal(now, "elsewhere")
        log.warning("autockpt: the mirror's claim by %s was not renewed for %.0fs; taking it over",
                    found.describe(), self.stale_after_s)  # fmt: skip

    def _in_this_process(self, found: Claim) -> bool:
        return self._me.shares_pid_space(found.host, found.boot, found.pid_ns) and self._me.is_process(
            found.pid, found.pid_started
        )

    def _refusal(self, found: Claim, where: str) -> DirectoryLockedError:
        takeover = "" if where == "in this process" else (
            ", or, if that run is hung and this one replaces it, set mirror_takeover=True (that run then "
            "stops uploading at its next heartbeat)"
        )  # fmt: skip
        return DirectoryLockedError(
            f"autockpt: another session {where} is using {self.storage.location} as its mirror ({found.describe()}); "
            "two runs sharing a mirror would resume each other's checkpoints. Fix: wait for that run to end "
            f"(or stop it), or give this run another mirror{takeover}. A claim left by a run that is gone expires "
            f"{self.stale_after_s:.0f}s after its last heartbeat, or remove {self.storage.location}/{CLAIM_NAME}.",
            self.storage.location,
            dataclasses.asdict(found),
        )

    # -- holding --------------------------------------------------------------------------------

    def _write(self) -> None:
        me = self._me
        claim = Claim(
            self.session, self._run(), me.host, me.pid, self._framework, self._started, self._beat,
            me.boot, me.pid_ns, me.started,
        )  # fmt: skip
        data = json.dumps(dataclasses.asdict(claim)).encode("utf-8")
        self.storage.write_atomic(CLAIM_NAME, lambda f: f.write(data))

    def _heartbeat(self) -> None:
        failing = False
        while not self._stop.wait(self.heartbeat_s):
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    found = read_claim(self.storage)
                    if found is not None and found.session != self.session:
                        self._lose(found)
                        return
                    self._beat += 1
                    self._write()
                except Exception as exc:  # noqa: BLE001 - tried again at the next beat
                    if not failing:
                        log.warning("autockpt: could not renew the mirror claim in %s (%s: %s); trying again",
                                    self.storage.location, type(exc).__name__, exc)  # fmt: skip
                    failing = True
                else:
                    failing = False

    def _lose(self, found: Claim) -> None:
        self.lost = (
            f"another session took over the mirror {self.storage.location} ({found.describe()}): two runs were "
            "writing to one mirror. This run stops uploading; its checkpoints stay committed in dirpath. Fix: give "
            "each run its own mirror"
        )
        log.error("autockpt: %s", self.lost)
        self._on_lost(self.lost)


def take_mirror(
    mirror: Storage,
    framework: str,
    run: Callable[[], str | None],
    on_lost: Callable[[str], None],
    store_now: float | None,
    take_over: bool = False,
) -> DirectoryLock | MirrorClaim | None:
    """Lock a local mirror directory, or claim a URL mirror (see the module docstring); returns
    what to ``release()`` at the session's end (None: a filesystem without locks, warned).
    ``take_over``: take a URL mirror's claim even from a live run."""
    if mirror.local_path(CLAIM_NAME) is not None:
        return lock_directory(mirror, framework, field="mirror")
    claim = MirrorClaim(mirror, framework, run, on_lost, take_over=take_over)
    claim.take(store_now)
    return claim

