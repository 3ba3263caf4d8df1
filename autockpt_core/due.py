"""What the driver takes at a boundary (:class:`Due`), and the two ways a due checkpoint is put off.

:class:`Deferral`: a checkpoint due at a boundary the adapter reports ``unclean`` (one a resumed run
cannot continue from exactly) is taken at the next boundary, once: Lightning's next step end,
Keras' next epoch start. With ``signals_wait=True`` a signal there waits too (Lightning: the
run is stopped at the next clean step); otherwise a signal checkpoints at once.

:class:`PreparationGate`: a checkpoint the policy calls due while a one-time preparation of the snapshot
still runs in the background (the session's buffer prefault, the adapter's ``preparing``, e.g.
TensorFlow tracing its batched read) would wait for the rest of it on the training thread. It
is taken at the first step end after the preparation finished instead, at most
``PREPARATION_WAIT_S`` of training later (then it waits). A signal's checkpoint, the final one
and those of ``every_n_steps`` (exact steps asked for) are not put off.

Threading: training thread only.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

__all__ = ["PREPARATION_WAIT_S", "Deferral", "Due", "PreparationGate"]

PREPARATION_WAIT_S = 30.0  # the longest a due checkpoint waits for a one-time preparation


@dataclasses.dataclass(frozen=True)
class Due:
    """A checkpoint the adapter's ``take`` is to take now, of the state at this boundary.

    ``reason``: process 0's (it decides; empty on the other processes, except after a signal);
    ``final``: the end-of-training checkpoint; ``exact``: False when a run cannot continue from
    this boundary exactly (a final checkpoint at an unclean boundary; recorded in its meta).
    """

    step: int
    reason: str
    final: bool = False
    exact: bool = True


@dataclasses.dataclass(frozen=True)
class Deferral:
    """A checkpoint put off from ``step`` to the next boundary."""

    step: int
    reason: str | None  # None: only a signal was put off; "" on the processes that do not decide

    def reason_at(self, step: int) -> str | None:
        if not self.reason or step == self.step:
            return self.reason
        return f"{self.reason} (deferred from step {self.step})"


@dataclasses.dataclass(frozen=True)
class _Waiting:
    """A due checkpoint put off while a one-time preparation runs (process 0)."""

    step: int
    reason: str
    since: float  # the driver's clock when it was first due

    def reason_at(self, step: int) -> str:
        if step == self.step:
            return self.reason
        return f"{self.reason} (deferred from step {self.step}: a one-time preparation was still running)"


class PreparationGate:
    """Process 0, after each decision: a due checkpoint waits while ``preparing()`` says a
    one-time preparation runs (at most :data:`PREPARATION_WAIT_S` by ``clock``); one put off is
    taken at the first decision after it finished. ``exact_steps`` (``every_n_steps``): never put off."""

    def __init__(self, clock: Callable[[], float], exact_steps: bool) -> None:
        self._clock = clock
        self._exact_steps = exact_steps
        self.waiting: _Waiting | None = None

    def check(self, step: int, save: bool, reason: str, preparing: Callable[[], bool]) -> tuple[bool, str]:
        """Whether to take the decision's checkpoint now, and its reason."""
        waiting = self.waiting
        if (waiting is None and not save) or self._exact_steps:
            return save, reason
        if not preparing():
            self.waiting = None
            return True, waiting.reason_at(step) if waiting is not None else reason
        now = self._clock()
        if waiting is None:
            waiting = _Waiting(step, reason, now)
        if now - waiting.since < PREPARATION_WAIT_S:
            self.waiting = waiting
            return False, reason
        self.waiting = None
        return True, waiting.reason_at(step)
