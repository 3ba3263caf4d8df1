"""Where a request for an emergency checkpoint can come from, and the one handler that gathers them.

Signals are the handler's own (:class:`~autockpt_core.preemption.PreemptionHandler`); any
other source is a :class:`PreemptionSource`: started when the handler installs, stopped when it
uninstalls, and calling ``request(signum, name)`` from its own thread when the job must stop.
The driver (:class:`~autockpt_core.fit_driver.FitDriver`) sees every request the same way (the
handler's ``signum``), agrees on it over processes and commits the emergency checkpoint at the
next step boundary. A new source is one module and one keyword of
:class:`~autockpt_core.config.Config`, built here; neither adapter changes.

Sources: :class:`~autockpt_core.deadline.DeadlineWatch` (``deadline``),
:class:`~autockpt_core.cloud_notice.NoticeWatch` (``preemption_notice``).

Call order: :func:`preemption_for` at the fit's start (the adapter's training thread), before
the handler is installed; :func:`emergency_lead` wires the measured emergency cost in once the
session exists (the driver's constructor).
"""

from __future__ import annotations

from collections.abc import Callable
from types import FrameType
from typing import Protocol

from .cloud_notice import NoticeWatch, parse_notice
from .config import Config
from .deadline import DeadlineWatch, resolve
from .preemption import PreemptionHandler


class PreemptionSource(Protocol):
    """A source of preemption requests other than a signal."""

    name: str

    def start(self, request: Callable[[int, str], None]) -> None: ...

    def stop(self) -> None: ...


def preemption_for(config: Config, *, alive: Callable[[FrameType | None], bool] | None = None) -> PreemptionHandler | None:
    """The fit's preemption handler: ``config.signals`` and the sources ``config`` asks for;
    None when there are neither."""
    sources: list[PreemptionSource] = []
    end = resolve(config.deadline)
    if end is not None:
        sources.append(DeadlineWatch(end))
    notice = parse_notice(config.preemption_notice)
    if notice is not None:
        sources.append(NoticeWatch(*notice, poll_s=config.notice_poll_interval))
    if not config.signals and not sources:
        return None
    return PreemptionHandler(config.signals, alive=alive, sources=sources)


def emergency_lead(handler: object, session: object) -> None:
    """Give the handler's deadline watches the cost of an emergency checkpoint the session
    measures (its status figures); no handler, or no session (a process that does not write):
    the watches keep their unmeasured lead."""
    status = getattr(session, "status", None)
    measured = getattr(status, "emergency_lead_s", None)
    for source in getattr(handler, "sources", ()) if measured is not None else ():
        if isinstance(source, DeadlineWatch):
            source.lead = measured
