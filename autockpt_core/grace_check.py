"""Whether an emergency checkpoint fits the grace period, judged once it is measured.

A scheduler that preempts a job sends a signal and, ``grace_period`` later, SIGKILL. The
emergency checkpoint must be durable before that: its snapshot stall plus its persist, with
:data:`EXIT_MARGIN_S` left to exit. :class:`GraceCheck` compares the
profiler's measured costs with the window once both are known and warns once, with the numbers
and the fix, when they do not fit. Training thread (the session's ``save()``, after each
checkpoint's copy). :func:`mirror_wait`: what is left of the window for the mirror once the
emergency checkpoint is committed locally (``CheckpointStore.commit_emergency``).
"""

from __future__ import annotations

import warnings
from typing import Callable

from .policy import Estimates

EXIT_MARGIN_S = 2.0
"""Of the grace period, kept for the process to exit once its checkpoint is durable."""


def mirror_wait(grace_period: float, mirror_preempt_wait: float | None, elapsed_s: float) -> float:
    """How long the mirror may take the emergency checkpoint: ``mirror_preempt_wait`` where set,
    else what is left of ``grace_period`` ``elapsed_s`` after the signal, less
    :data:`EXIT_MARGIN_S` (0 when nothing is left: the local checkpoint must do)."""
    if mirror_preempt_wait is not None:
        return mirror_preempt_wait
    return round(max(0.0, grace_period - elapsed_s - EXIT_MARGIN_S), 1)


class GraceCheck:
    """Warns once per session when a measured checkpoint would not fit ``grace_s``."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.warned = False

    def check(self, estimates: Callable[[], Estimates]) -> bool:
        """True when it warned now; ``estimates`` (the profiler's) is called only until then."""
        if self.warned:
            return False
        est = estimates()
        stall, persist = est.stall_s, est.persist_s
        if stall is None or persist is None or stall + persist + EXIT_MARGIN_S <= self.grace_s:
            return False
        self.warned = True
        warnings.warn(
            f"autockpt: a checkpoint takes about {stall + persist:.1f} s here (stall {stall:.2f} s + persist "
            f"{persist:.1f} s), more than grace_period={self.grace_s:g} s allows with {EXIT_MARGIN_S:g} s to "
            "exit: a preemption would be ended by SIGKILL before its checkpoint is durable, and the rerun "
            "would resume from the one before. Fix: give the job a longer grace period (Kubernetes' "
            "terminationGracePeriodSeconds, Slurm's --signal=TERM@N) and set grace_period to it, or a "
            "faster dirpath (a local disk, with mirror= for the remote copy)",
            RuntimeWarning,
            stacklevel=2,
        )
        return True
