"""After a preemption signal: wait until the emergency checkpoint is committed and report it.

Both adapters, at the point where they act on a signal (training thread, after handing the
emergency checkpoint of this step to the session, or deciding none is needed because the
newest one already holds this step), call :func:`commit_emergency` (through ``FitDriver``);
then they raise :class:`~autockpt_core.Preempted` when ``on_preempt == "exit"``, or clear the
handler and go on. ``session`` is None on the ranks of a distributed job that do not write
(they only record the step and the signal). The commit itself is the checkpoint store's
(:meth:`~autockpt_core.checkpoint_store.CheckpointStore.commit_emergency`); this module
reports it: the status file, the log, the message.
"""

from __future__ import annotations

import logging
import signal
import time

from .checkpoint_store import EmergencyCommit
from .preemption import PreemptionRecord, exit_code, stops
from .session import CheckpointSession

__all__ = ["commit_emergency"]

log = logging.getLogger("autockpt")


def commit_emergency(
    session: CheckpointSession | None, step: int, signum: int, *, on_preempt: str, verbose: bool,
    received_at: float | None = None, source: str | None = None,
) -> PreemptionRecord:
    """Block until the newest checkpoint is durable and listed in ``dirpath`` (the status file
    then says ``preempted``, with the seconds since the signal); with a mirror, give it what is
    left of ``grace_period`` to get there too (best effort); print what happens next, naming
    which tier holds what and how many seconds the commit took since the signal
    (``received_at``, ``time.monotonic()``; None: since this call, e.g. another process's
    signal). ``source``: who asked, where not the signal itself (e.g. "deadline").

    Raises the persist's :class:`~autockpt_core.CheckpointWriteError` only if the checkpoint
    is not committed in ``dirpath`` (the previous one then stays the newest): a preemption never
    reports a checkpoint that is not there. A mirror that fails or is slow raises nothing here:
    the local checkpoint is what a rerun on this node resumes from, and the run exits 128 + n.
    """
    name = signal.Signals(signum).name
    if session is None:
        return PreemptionRecord(step=step, signal=name, path=None)

    def durable(seconds: float) -> None:
        session.report_status("preempted", step)
        session.status.preempted(step, seconds)

    done = session.store.commit_emergency(time.monotonic() if received_at is None else received_at, durable)
    if done.mirrored is False:
        log.warning("autockpt: checkpoint of step %d is committed in %s but not in the mirror %s: %s",
                    step, done.path, session.mirror.location if session.mirror else "", done.mirror_problem)  # fmt: skip
    if verbose:
        print(_message(session, step, signum, done, on_preempt, source), flush=True)
    return PreemptionRecord(step=step, signal=name, path=done.path, durable_s=done.durable_s if done.path else None)


def _message(session: CheckpointSession, step: int, signum: int, done: EmergencyCommit, on_preempt: str,
             source: str | None) -> str:  # fmt: skip
    """``autockpt: SIGTERM received; checkpoint of step N committed (path) 0.4 s after the
    signal (grace_period 30 s)[, and in the mirror M | ; not in the mirror M (why; its newest
    is step K)]; exiting with status 143``."""
    name = signal.Signals(signum).name
    by_signal = source in (None, name)
    asked = f"{name} received" if by_signal else f"the {source} came ({name})"
    then = f"exiting with status {exit_code(signum)}" if stops(on_preempt, signum) else "training continues"
    if not done.path:
        return f"autockpt: {asked}; nothing trained since step {step}; {then}"
    mirror = session.mirror
    in_mirror = ""
    if done.mirrored and mirror is not None:
        in_mirror = f", and in the mirror {mirror.location}"
    elif done.mirrored is False and mirror is not None:
        newest = done.mirror_newest
        kept = f"its newest is step {newest.step}" if newest is not None else "it has none of this session"
        in_mirror = f"; not in the mirror {mirror.location} ({done.mirror_problem}; {kept})"
    took = (f"{done.durable_s:.1f} s after the {'signal' if by_signal else source} "
            f"(grace_period {session.config.grace_period:g} s)")  # fmt: skip
    return f"autockpt: {asked}; checkpoint of step {step} committed ({done.path}) {took}{in_mirror}; {then}"
