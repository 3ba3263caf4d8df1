"""``CheckpointEvent``: what an ``AutoCheckpoint`` records per checkpoint it took.

Appended to ``AutoCheckpoint.events`` on the training thread once the snapshot has been
handed to the session (the file may still be in the writer thread); immutable afterwards.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .session import CheckpointSession


@dataclasses.dataclass(frozen=True)
class CheckpointEvent:
    """One checkpoint: when, why, and what it cost the training thread.

    ``stall_s``: the time ``session.save`` blocked the training thread (the framework's dump
    and the copy, plus any wait for the previous persist); ``nbytes``: the tensor payload
    copied; ``interval_steps``/``interval_rule``: the interval the policy had chosen;
    ``overhead``/``overhead_band``: the run's measured overhead up to this checkpoint (its own
    cost not yet in it) and the half-width of its ~95% band (:mod:`.policy.overhead_meter`).
    Keras also records ``batch`` (of ``epoch``) and where a run resumed from it continues:
    ``next_epoch`` and ``batches_done`` (batches of that epoch already trained).
    """

    step: int
    epoch: int
    reason: str
    interval_steps: int | None
    interval_rule: str | None
    stall_s: float
    nbytes: int
    batch: int | None = None
    next_epoch: int | None = None
    batches_done: int = 0
    overhead: float | None = None
    overhead_band: float | None = None

    @classmethod
    def after_save(
        cls, session: CheckpointSession, step: int, epoch: int, reason: str, stall_s: float, nbytes: int, **where: int
    ) -> CheckpointEvent:
        """The event of the checkpoint ``session.save`` just took (its interval: the session's
        last decision's); ``where``: ``batch``, ``next_epoch``, ``batches_done``."""
        decision = session.last_decision
        interval = decision.interval if decision is not None else None
        overhead = session.measured_overhead()
        return cls(
            step=step, epoch=epoch, reason=reason,
            interval_steps=interval.steps if interval is not None else None,
            interval_rule=interval.rule if interval is not None else None,
            stall_s=stall_s, nbytes=nbytes, overhead=overhead.value, overhead_band=overhead.band,
            **where,  # type: ignore[arg-type]
        )  # fmt: skip
