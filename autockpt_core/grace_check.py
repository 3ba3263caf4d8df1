"""Whether an emergency checkpoint fits the grace period, judged once it is measured.

A scheduler that preempts a job sends a signal and, ``grace_period`` later, SIGKILL. The
emergency checkpoint must be durable before that: its snapshot stall plus its persist, with
:data:`EXIT_MARGIN_S` left to exit. :class:`GraceCheck` compares the
profiler's measured costs with the window once both are known and warns once, with the numbers
and the fix, when they do not fit. Training thread (the session's ``save()``, after each
checkpoint's copy).
"""

from __future__ import annotations

import warnings
from typing import Callable

from .policy import Estimates

EXIT_MARGIN_S = 2.0
"""Of the grace period, kept for the process to exit once its checkpoint is durable."""


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
