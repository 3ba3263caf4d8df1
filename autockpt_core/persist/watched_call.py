"""A blocking call with a deadline on its progress: run it in a thread, give up when it stalls.

Storage calls can block with no end: a hard-mounted NFS or FUSE mount whose server went away,
a TCP connection to an endpoint that accepted and went silent. A thread blocked there cannot
be interrupted, so :func:`call_watched` runs the call in a daemon thread of its own and waits
for it, while the call reports progress (:meth:`Progress.mark`, e.g. after each block it
wrote). No progress for ``stall_s`` seconds raises :class:`CallStalled` in the waiting thread
and sets :attr:`Progress.abandoned`, which the call checks between its steps (so one that
comes back later stops and lists nothing); a call still blocked stays in its daemon thread
until the operating system or the network ends it, and never holds up the process's exit.

``stop()``, asked at each poll, ends the wait early with :class:`CallStalled` too (the caller
gave up for another reason, e.g. a newer record to upload first).

Threading: :func:`call_watched` from the thread that would otherwise block; the call runs in
a new daemon thread; :class:`Progress` is shared by both.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

__all__ = ["CallStalled", "Progress", "call_watched"]

T = TypeVar("T")

POLL_S = 0.2


class CallStalled(Exception):
    """A watched call made no progress for its deadline (or its waiter stopped waiting)."""


class Progress:
    """What a watched call and its waiter share: when the call last moved, and whether the
    waiter gave up on it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.at = clock()
        self.abandoned = False

    def mark(self) -> None:
        """The call moved (any thread)."""
        self.at = self._clock()

    def idle_s(self) -> float:
        return self._clock() - self.at


def call_watched(
    call: Callable[[Progress], T],
    stall_s: float,
    what: str,
    clock: Callable[[], float] = time.monotonic,
    stop: Callable[[], bool] | None = None,
) -> T:
    """Run ``call(progress)`` in a daemon thread and return its result or raise its error;
    :class:`CallStalled` (naming ``what``) once it made no progress for ``stall_s`` seconds or
    ``stop()`` returns True. The call should :meth:`~Progress.mark` as it moves and check
    :attr:`~Progress.abandoned` before any step that would make its result visible."""
    progress = Progress(clock)
    outcome: list[object] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(call(progress))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name=f"autockpt-{what.split()[0]}", daemon=True).start()
    while not done.wait(min(POLL_S, stall_s)):
        idle = progress.idle_s()
        stopped = stop is not None and stop()
        if idle >= stall_s or stopped:
            progress.abandoned = True
            if stopped:
                raise CallStalled(f"{what} was abandoned")
            raise CallStalled(f"{what} made no progress for {idle:.1f}s (stall timeout {stall_s:g}s)")
    if failure:
        raise failure[0]
    return outcome[0]  # type: ignore[return-value]
