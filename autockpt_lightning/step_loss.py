"""The loss in ``training_step``'s output, for the driver's loss check and front-loaded schedule.

The callback hands the driver the raw outputs at every step; the driver calls :func:`float_loss`
only at a decision or at the end (training thread): on CUDA, reading the value waits for the step.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch


def float_loss(outputs: Any) -> float | None:
    """The loss in ``training_step``'s output as a float (on CUDA this waits for the step)."""
    loss = loss_of(outputs)
    return float(loss) if loss is not None else None


def loss_of(outputs: Any) -> torch.Tensor | float | None:
    """The scalar loss in ``training_step``'s output (a tensor or a dict with "loss"), if any,
    detached and not read: on CUDA, reading it waits for the step to finish on the device."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if isinstance(loss, torch.Tensor):
        return loss.detach() if loss.numel() == 1 else None
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss)
    return None
