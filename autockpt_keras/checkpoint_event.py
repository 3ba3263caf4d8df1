"""``CheckpointEvent``: the record :class:`~autockpt_keras.callback.AutoCheckpoint` keeps per checkpoint.

Appended to ``AutoCheckpoint.events`` on the training thread, when the snapshot has been
handed to the session (the file may still be in the writer thread); immutable afterwards.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CheckpointEvent:
    """One checkpoint this callback took: when, why, and what it cost the training thread.

    ``next_epoch``/``batches_done``: where a run resumed from it continues (epoch, and
    batches of that epoch already trained).
    """

    step: int
    epoch: int
    batch: int | None
    next_epoch: int
    reason: str
    interval_steps: int | None
    interval_rule: str | None
    stall_s: float
    nbytes: int
    batches_done: int = 0
