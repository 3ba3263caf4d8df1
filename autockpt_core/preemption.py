"""Preemption: turn termination signals into a flag that the training loop acts on.

A scheduler that preempts a job (SLURM, Kubernetes, spot instances) sends a signal (SIGTERM,
or a configurable warning signal such as SIGUSR1) some time before it kills the process. The
signal handler here does one thing: it records that the signal arrived. It never saves, locks
or allocates, because a handler runs between two bytecodes of the main thread, possibly
inside the checkpoint code itself. The adapter checks the flag at the next step boundary,
commits an emergency checkpoint (waiting until it is durable), then exits or continues.

API (framework-free; both adapters use it)::

    handler = PreemptionHandler(("SIGTERM", "SIGUSR1"))   # or Config.signals
    handler.install()           # training thread = main thread, at train start
    ...                         # after each optimizer step:
    if handler.requested:       # a signal arrived since the last clear()
        save_and_wait()
        if stops(on_preempt, handler.signum):
            raise Preempted(handler.signum)     # SystemExit(128 + signum)
        handler.clear()
    ...
    handler.uninstall()         # at train end / on exception: previous handlers are back

Repeats of the signal being acted on (not yet ``clear``-ed): the first repeat within
:data:`REPEAT_ABSORBED_S` of the signal is absorbed and logged. It is the same request
delivered twice: under ``srun torchrun ...`` Slurm signals every process of the step and
torchrun forwards the signal to its workers again, milliseconds apart. A later repeat, or a
third signal, is not deferred: the handler puts the previous dispositions back and delivers the
signal again, so the default action (terminate) ends a job whose emergency checkpoint is stuck.
SIGINT (when configured) is not absorbed: a second Ctrl-C raises ``KeyboardInterrupt`` at once.
(A different signal meanwhile, e.g. SIGTERM after SLURM's SIGUSR1 warning, is only counted.) Likewise, when
``alive()`` (given to the constructor) says training is over, a signal is handed to the
previous disposition: a ``fit()`` that raised without uninstalling cannot swallow signals.

Chaining: ``install`` remembers the handlers that were installed before and calls a previous
*Python* handler after setting the flag, so the user's own handler still runs (Lightning's
SIGTERM handler is not chained: the Lightning adapter takes SIGTERM over from it). A previous
``SIG_DFL`` or ``SIG_IGN`` is not called: replacing "terminate now" with "checkpoint, then
exit" is the point; nor is Python's SIGINT handler on the first SIGINT (it would raise
``KeyboardInterrupt`` mid-step), nor another autockpt handler (one left installed by a
``fit()`` that raised is skipped for the handler it had replaced). ``uninstall`` puts the previous handlers back; if another component
installed its own handler on top of ours meanwhile, that one is left in place and ours only
stops recording (it then forwards the signal as the previous handler would have handled it).

Threading: Python runs signal handlers in the main thread only, and ``signal.signal`` may only
be called there; ``install`` on another thread installs no signal handler and logs why
(``requested`` then stays False unless a source asks; the adapter's periodic checkpoints still
work).

Other sources (``sources``: a deadline, :mod:`autockpt_core.preemption_sources`) are started by
``install`` and stopped by ``uninstall``; from their own threads they call :meth:`request`,
which the training loop sees exactly as a signal (``requested``, ``signum``; ``source`` names
who asked).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Iterable, Union

__all__ = [
    "DEFAULT_SIGNALS",
    "REPEAT_ABSORBED_S",
    "ON_PREEMPT",
    "Preempted",
    "PreemptionHandler",
    "exit_code",
    "signal_names",
    "stops",
]

log = logging.getLogger("autockpt")

DEFAULT_SIGNALS: tuple[str, ...] = ("SIGTERM", "SIGUSR1", "SIGINT")
"""SIGINT is Ctrl-C: by default it commits the step's checkpoint and stops (status 130)."""
REPEAT_ABSORBED_S = 1.0
"""A repeat of the signal being acted on within this many seconds of it is the same delivery
twice (absorbed, once); a later one, or a third, ends the process by the previous disposition."""
ON_PREEMPT: tuple[str, ...] = ("exit", "continue")
_UNCATCHABLE = {"SIGKILL", "SIGSTOP"}

_Handler = Union[Callable[[int, Any], Any], int, None]


def signal_names(values: Iterable[str | int]) -> tuple[str, ...]:
    """Canonical names (``"SIGTERM"``) for names, short names (``"TERM"``, ``"usr1"``) or numbers.

    Raises ``ValueError`` naming the bad entry for a signal this platform does not have or one
    that cannot be caught (SIGKILL, SIGSTOP). Duplicates are dropped, order kept.
    """
    names: list[str] = []
    for value in values:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not a signal")
        if isinstance(value, int):
            try:
                name = signal.Signals(value).name
            except ValueError:
                raise ValueError(f"{value} is not a signal number on this platform") from None
        elif isinstance(value, str):
            text = value.strip().upper()
            name = text if text.startswith("SIG") else "SIG" + text
            if not isinstance(getattr(signal, name, None), signal.Signals):
                raise ValueError(f"{value!r} is not a signal on this platform")
        else:
            raise ValueError(f"{value!r} is not a signal name")
        if name in _UNCATCHABLE:
            raise ValueError(f"{name} cannot be caught, so it cannot trigger a checkpoint")
        if name not in names:
            names.append(name)
    return tuple(names)


def stops(on_preempt: str, signum: int) -> bool:
    """Whether the run ends after the emergency checkpoint of ``signum``: with
    ``on_preempt="exit"``, and always for SIGINT (Ctrl-C asks to stop; "continue" is for a
    scheduler's warning signals)."""
    return on_preempt == "exit" or signum == signal.SIGINT


def exit_code(signum: int) -> int:
    """The exit status a preempted run ends with: 128 + signal number (143 for SIGTERM).

    It is what a shell reports for a process stopped by that signal, so job scripts and
    schedulers treat the run as terminated (and a batch script can requeue on it).
    """
    return 128 + int(signum)


class Preempted(SystemExit):
    """Raised by an adapter after the emergency checkpoint is durable (``on_preempt="exit"``).

    A ``SystemExit``: uncaught, the interpreter exits quietly with :func:`exit_code`.
    """

    def __init__(self, signum: int, step: int | None = None) -> None:
        self.signum = int(signum)
        self.step = step
        super().__init__(exit_code(self.signum))

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    def describe(self, dirpath: str) -> str:
        """One line for a program that catches this to end quietly (the demos): what the run
        left in ``dirpath`` and how to go on."""
        held = f"the checkpoint of step {self.step} is committed" if self.step is not None else "its newest checkpoint is"
        return f"interrupted by {self.signal_name}: {held} in {dirpath}; rerun the same command to resume from it"


@dataclasses.dataclass(frozen=True)
class PreemptionRecord:
    """The emergency checkpoint an adapter took after a signal: its step, the signal, the file,
    and the seconds from the signal to the checkpoint's commit (None: nothing was written)."""

    step: int
    signal: str
    path: str | None
    durable_s: float | None = None


class PreemptionHandler:
    """Records which of ``signals`` arrived; see the module docstring for the protocol.

    ``requested`` and ``signum`` are safe to read from any thread. The handler itself only
    assigns two attributes (atomic under the GIL) and calls a chained previous handler.
    """

    def __init__(
        self,
        signals: Iterable[str | int] = DEFAULT_SIGNALS,
        *,
        chain: bool = True,
        alive: Callable[[FrameType | None], bool] | None = None,
        sources: Iterable[Any] = (),
    ) -> None:
        self.signals = signal_names(signals)
        self.sources = tuple(sources)  # PreemptionSource objects: start(request), stop()
        self.source: str | None = None  # who asked: a signal's name, or a source's
        self.chain = chain
        self.alive = alive  # called in the handler with the interrupted frame
        self.signum: int | None = None  # the first signal since the last clear()
        self.count = 0  # signals received since install()
        self.absorbed = 0  # repeats taken as the same delivery since the last clear()
        self._first_at = 0.0  # time.monotonic() of the signal being acted on
        self._previous: dict[int, _Handler] = {}
        self._installed = False
        self._sources_running = False

    # -- training thread ---------------------------------------------------------------------

    @property
    def requested(self) -> bool:
        """True once one of the signals arrived (until ``clear``)."""
        return self.signum is not None

    @property
    def received_at(self) -> float | None:
        """``time.monotonic()`` when the signal being acted on arrived (None: none yet)."""
        return None if self.signum is None else self._first_at

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    @property
    def installed(self) -> bool:
        return self._installed

    def clear(self) -> None:
        """Forget the received signal (``on_preempt="continue"``, after the checkpoint)."""
        self.signum = None
        self.source = None
        self.absorbed = 0

    def request(self, signum: int, source: str) -> None:
        """A source other than a signal asks for the emergency checkpoint (any thread): taken as
        ``signum`` arriving now, unless a request is already being acted on."""
        if self.signum is None:
            self._first_at = time.monotonic()
            self.source = source
            self.signum = signum  # last: the training thread reads signum first

    def install(self) -> bool:
        """Install the handler for every signal (main thread only) and start the sources; True
        when the signals' handlers are installed."""
        if self._installed:
            return True
        if not self._sources_running:
            self.signum = self.source = None
            self._sources_running = True
            for source in self.sources:
                source.start(self.request)
        if not self.signals:
            return False
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "autockpt: not installing preemption handlers for %s: signal handlers can only be "
                "installed from the main thread (training runs in %r)",
                ", ".join(self.signals),
                threading.current_thread().name,
            )
            return False
        self.count = 0
        self.absorbed = 0
        self._previous = {}
        for name in self.signals:
            signum = int(getattr(signal, name))
            self._previous[signum] = _unwrap(signal.getsignal(signum), signum)
            signal.signal(signum, self._handle)
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Stop the sources; put the previous handlers back (where ours is still the installed one)."""
        if self._sources_running:
            self._sources_running = False
            for source in self.sources:
                source.stop()
        if not self._installed:
            return
        self._installed = False
        if threading.current_thread() is not threading.main_thread():
            return  # cannot touch handlers here; ours now only forwards (see _handle)
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    def owns(self, handler: object) -> bool:
        """Whether ``handler`` (e.g. from ``signal.getsignal``) is this instance's handler."""
        return handler == self._handle

    def previous(self, signum: int) -> _Handler:
        """The handler that was installed for ``signum`` before ``install`` (SIG_DFL if none)."""
        previous = self._previous.get(int(signum))
        return previous if previous is not None else signal.SIG_DFL

    def __enter__(self) -> "PreemptionHandler":
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # -- signal handler (main thread, between two bytecodes) ---------------------------------

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum)
        if self._installed and self.alive is not None and not self.alive(frame):
            self.uninstall()  # training ended without uninstalling us (it raised)
        if not self._installed:
            # Stale: someone re-installed us after uninstall(). Behave as the previous handler.
            _deliver(signum, frame, previous)
            return
        self.count += 1
        if self.signum == signum:
            since = time.monotonic() - self._first_at
            name = signal.Signals(signum).name
            if not self.absorbed and since <= REPEAT_ABSORBED_S and signum != signal.SIGINT:
                self.absorbed += 1  # the same request delivered twice (srun + torchrun)
                log.warning("autockpt: %s received again %.0f ms after the first: taken as the same "
                            "request; a third ends the process", name, since * 1e3)  # fmt: skip
                return
            # A later repeat or a third: the emergency checkpoint may be stuck. Give up the
            # signals and let the previous disposition (default: terminate) act.
            log.warning("autockpt: %s received again; no longer deferring it", name)
            self.uninstall()
            _deliver(signum, frame, previous)
            return
        if self.signum is None:
            self._first_at = time.monotonic()
            self.source = signal.Signals(signum).name
            self.signum = signum
        # Python's SIGINT handler raises KeyboardInterrupt mid-step: the first SIGINT is ours alone.
        if self.chain and callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)


def _unwrap(handler: _Handler, signum: int) -> _Handler:
    """``handler``, or, when it is another PreemptionHandler's (one a ``fit()`` that raised left
    installed), the handler that one replaced: autockpt handlers never chain to each other."""
    while isinstance(getattr(handler, "__self__", None), PreemptionHandler):
        handler = handler.__self__._previous.get(signum, signal.SIG_DFL)  # type: ignore[union-attr]
    return handler


def _deliver(signum: int, frame: FrameType | None, previous: _Handler) -> None:
    """Handle ``signum`` as ``previous`` would: call it, ignore, or die by the default action."""
    if callable(previous):
        previous(signum, frame)
    elif previous in (signal.SIG_DFL, None):
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
