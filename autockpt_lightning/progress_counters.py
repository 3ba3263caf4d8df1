"""The trainer's step and epoch counts, read per step without Lightning's property chains.

``trainer.global_step`` and ``trainer.current_epoch`` walk five to eight properties each (the
loop, its optimization, its progress): microseconds per step, cold after a training step. Both
end at a progress tracker whose ``completed`` is a plain attribute, and Lightning resets and
restores those trackers in place, so the callback finds them once per ``fit()``
(``on_train_start``) and reads ``completed`` at each step. Where a Lightning release lays its
loops out differently (the tracker is not found, or does not count what the property says),
the properties are read instead.

Threading: training thread.
"""

from __future__ import annotations

from typing import Any, Protocol

import lightning.pytorch as pl

__all__ = ["NOT_STARTED", "Counter", "epoch_counter", "step_counter"]


class Counter(Protocol):
    @property
    def completed(self) -> int: ...


class _NotStarted:
    """Before ``on_train_start``: no count to read."""

    @property
    def completed(self) -> int:
        raise RuntimeError("AutoCheckpoint hooks ran before on_train_start; use it through Trainer.fit().")


NOT_STARTED: Counter = _NotStarted()


class _Property:
    """``completed`` reads a trainer property (the fallback)."""

    def __init__(self, trainer: pl.Trainer, name: str) -> None:
        self._trainer, self._name = trainer, name

    @property
    def completed(self) -> int:
        return int(getattr(self._trainer, self._name))


def _checked(tracker: Any, trainer: pl.Trainer, name: str) -> Counter:
    if isinstance(getattr(tracker, "completed", None), int) and tracker.completed == getattr(trainer, name):
        return tracker  # type: ignore[no-any-return]
    return _Property(trainer, name)


def step_counter(trainer: pl.Trainer) -> Counter:
    """The tracker whose ``completed`` is ``trainer.global_step`` (automatic or manual optimization)."""
    loop = trainer.fit_loop.epoch_loop
    try:
        if trainer.lightning_module.automatic_optimization:
            tracker = loop.automatic_optimization.optim_progress.optimizer.step.total
        else:
            tracker = loop.manual_optimization.optim_step_progress.total
    except AttributeError:
        tracker = None
    return _checked(tracker, trainer, "global_step")


def epoch_counter(trainer: pl.Trainer) -> Counter:
    """The tracker whose ``completed`` is ``trainer.current_epoch``."""
    tracker = getattr(getattr(trainer.fit_loop, "epoch_progress", None), "current", None)
    return _checked(tracker, trainer, "current_epoch")
