"""The step a Lightning fit is planned to end after, for the driver's ``expect_end``."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["planned_end_step"]


def planned_end_step(trainer: Any) -> int | None:
    """``trainer.estimated_stepping_batches`` (``max_steps``, or ``max_epochs`` × optimizer steps
    per epoch, whichever comes first) where it is a finite step count, else None (an iterable
    dataset without ``max_steps``, infinite training, or an estimate Lightning refuses).
    Early stopping and ``max_time`` can end the fit sooner; the policy only needs an estimate."""
    try:
        steps = trainer.estimated_stepping_batches
    except Exception:  # e.g. accumulate_grad_batches that changes per epoch
        return None
    if not isinstance(steps, (int, float)) or not math.isfinite(steps) or steps <= 0:
        return None
    return int(steps)
