"""After a preemption signal: wait until the emergency checkpoint is committed and report it.

Both adapters, at the point where they act on a signal (training thread, after handing the
emergency checkpoint of this step to the session, or deciding none is needed because the
newest one already holds this step), call :func:`commit_emergency`; then they raise
:class:`~autockpt_core.Preempted` when ``on_preempt == "exit"``, or clear the handler and go
on. ``session`` is None on the ranks of a distributed job that do not write (they only
record the step and the signal).
"""

from __future__ import annotations

import logging
import signal
import time

from .config import Config
from .grace_check import EXIT_MARGIN_S
from .persist import location_of
from .preemption import PreemptionRecord, exit_code
from .session import CheckpointSession

__all__ = ["commit_emergency", "mirror_wait"]

log = logging.getLogger("autockpt")

def mirror_wait(config: Config, elapsed_s: float) -> float:
    """How long the mirror may take the emergency checkpoint: ``mirror_preempt_wait`` where set,
    else what is left of ``grace_period`` ``elapsed_s`` after the signal, less
    :data:`EXIT_MARGIN_S` (0 when nothing is left: the local checkpoint must do)."""
    if config.mirror_preempt_wait is not None:
        return config.mirror_preempt_wait
    return round(max(0.0, config.grace_period - elapsed_s - EXIT_MARGIN_S), 1)


def commit_emergency(
    session: CheckpointSession | None, step: int, signum: int, *, on_preempt: str, verbose: bool,
    received_at: float | None = None, source: str | None = None,
) -> PreemptionRecord:
    """Block until the newest checkpoint is durable and listed in ``dirpath``; with a mirror,
    give it :func:`mirror_wait` to get there too (best effort); print what happens next, naming
    which tier holds what and how many seconds of ``grace_period`` the commit took since the
    signal (``received_at``, ``time.monotonic()``; None: since this call, e.g. another
    process's signal). ``source``: who asked, where not the signal itself (e.g. "deadline").

    Raises the persist's :class:`~autockpt_core.CheckpointWriteError` only if the checkpoint
    is not committed in ``dirpath`` (the previous one then stays the newest): a preemption never
    reports a checkpoint that is not there. A mirror that fails or is slow raises nothing here:
    the local checkpoint is what a rerun on this node resumes from, and the run exits 128 + n.
    """
    name = signal.Signals(signum).name
    asked = f"{name} received" if source in (None, name) else f"the {source} came ({name})"
    since = time.monotonic() if received_at is None else received_at
    path, durable_s = None, None
    if session is not None:
        session.writer.wait()  # durable and listed in dirpath's manifest before we go on
        durable_s = time.monotonic() - since
        session.report_status("preempted", step)
        record = session.writer.last_record
        path = location_of(session.storage, record.name) if record is not None else None
        mirror = session.mirror
        in_mirror = ""
        if record is not None and mirror is not None:
            delivery = mirror.deliver(record, mirror_wait(session.config, time.monotonic() - since))
            if delivery.uploaded:
                in_mirror = f", and in the mirror {mirror.location}"
            else:
                newest = mirror.last_record
                kept = f"its newest is step {newest.step}" if newest is not None else "it has none of this session"
                in_mirror = f"; not in the mirror {mirror.location} ({delivery.problem}; {kept})"
                log.warning("autockpt: checkpoint of step %d is committed in %s but not in the mirror %s: %s",
                            step, path, mirror.location, delivery.problem)  # fmt: skip
            # the claim's removal at close() gets what is left of the window (half the exit margin kept)
            session.store.exit_within(session.config.grace_period - (time.monotonic() - since) - EXIT_MARGIN_S / 2)
        if verbose:
            then = f"exiting with status {exit_code(signum)}" if on_preempt == "exit" else "training continues"
            what = f"nothing trained since step {step}"
            if path:
                took = f"{durable_s:.1f} s after the {'signal' if source in (None, name) else source} (grace_period {session.config.grace_period:g} s)"
                what = f"checkpoint of step {step} committed ({path}) {took}{in_mirror}"
            print(f"autockpt: {asked}; {what}; {then}", flush=True)
    return PreemptionRecord(step=step, signal=name, path=path, durable_s=durable_s if path else None)
