"""After a preemption signal: wait until the emergency checkpoint is committed and report it.

Both adapters, at the point where they act on a signal (training thread, after handing the
emergency checkpoint of this step to the session, or deciding none is needed because the
newest one already holds this step), call :func:`commit_emergency`; then they raise
:class:`~autockpt_core.Preempted` when ``on_preempt == "exit"``, or clear the handler and go
on. ``session`` is None on the ranks of a distributed job that do not write (they only
record the step and the signal).
"""

from __future__ import annotations

import signal

from .persist import location_of
from .persist.tiers import same_checkpoint
from .preemption import PreemptionRecord, exit_code
from .session import CheckpointSession

__all__ = ["commit_emergency"]


def commit_emergency(
    session: CheckpointSession | None, step: int, signum: int, *, on_preempt: str, verbose: bool
) -> PreemptionRecord:
    """Block until the newest checkpoint is durable and listed (and uploaded to the mirror, if
    any); print what happens next.

    Raises the persist's :class:`~autockpt_core.CheckpointWriteError` if it failed (the
    previous checkpoint then stays the newest): a preemption never reports a checkpoint that
    is not there.
    """
    name = signal.Signals(signum).name
    path = None
    if session is not None:
        session.flush()  # durable and listed in the manifest before we go on
        record = session.writer.last_record
        path = location_of(session.storage, record.name) if record is not None else None
        if verbose:
            then = f"exiting with status {exit_code(signum)}" if on_preempt == "exit" else "training continues"
            what = f"checkpoint of step {step} committed ({path})" if path else f"nothing trained since step {step}"
            mirror = session.mirror
            if record is not None and mirror is not None and mirror.last_record is not None:
                if same_checkpoint(mirror.last_record, record):
                    what += f", and in the mirror {mirror.location}"
            print(f"autockpt: {name} received; {what}; {then}", flush=True)
    return PreemptionRecord(step=step, signal=name, path=path)
