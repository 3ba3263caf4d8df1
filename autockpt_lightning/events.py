"""What the Lightning callback reports about the checkpoints it took (``AutoCheckpoint.events``)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CheckpointEvent:
    """One checkpoint this callback took: what the policy said and what it cost.

    ``stall_s`` is the time ``session.save`` blocked the training thread (dump_checkpoint and
    the copy, plus any wait for the previous persist); ``nbytes`` is the tensor payload copied.
    """

    step: int
    epoch: int
    reason: str
    interval_steps: int | None
    interval_rule: str | None
    stall_s: float
    nbytes: int
