"""The global step of a Keras fit, counted on the host instead of read from the device each batch.

``model.optimizer.iterations`` lives where the model does: reading it (``.numpy()``, or
``int()`` of a JAX array) waits for every step queued on a GPU, which, once per batch, takes
away the CPU's lead over the GPU. So the callback reads it at the fit's start and at each
epoch's start (a wait Keras pays there anyway for its epoch logs) and counts trained batches in
between: ``steps_per_execution`` batches trained by one call count as many steps.

The count never goes back: where the optimizer skipped steps (``LossScaleOptimizer`` after a
non-finite gradient) it stays ahead of ``iterations``, and a resume continues from the step of
the checkpoint it restored, so checkpoint steps always increase. Where a custom
``train_step`` applies the optimizer more than once per batch, the read at the next epoch's
start moves the count up to ``iterations``.

Call order (training thread): ``read_at(floor)`` at the fit's start (``floor``: the restored
checkpoint's step) and ``epoch_begin()``; per batch ``trained(batch)`` or ``skipped(batch)``
(a batch a resume drew without training it); ``step`` at any time.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["StepCount", "planned_end_step"]


class StepCount:
    """The step of one fit; ``read()`` returns the optimizer's iterations (may wait for a GPU)."""

    def __init__(self, read: Callable[[], int]) -> None:
        self._read = read
        self._step = 0
        self._last_batch = -1  # the newest batch index of this epoch counted or skipped

    @property
    def step(self) -> int:
        return self._step

    def read_at(self, floor: int | None = None) -> int:
        """The fit's start: the optimizer's iterations, or ``floor`` where that is higher."""
        self._step = max(self._read(), floor if floor is not None else 0)
        self._last_batch = -1
        return self._step

    def epoch_begin(self) -> int:
        """An epoch starts: batch indices restart; the count moves up to ``iterations`` if behind."""
        self._last_batch = -1
        self._step = max(self._step, self._read())
        return self._step

    def trained(self, batch: int) -> int:
        """Batches up to index ``batch`` of this epoch were trained (one call may train several)."""
        done = batch - self._last_batch
        self._step = step = self._step + (done if done > 1 else 1)
        self._last_batch = batch
        return step

    def skipped(self, batch: int) -> None:
        """Batches up to ``batch`` were drawn by a resume without training."""
        self._last_batch = batch


def planned_end_step(step: int, epoch: int, epochs: int | None, steps_per_epoch: int | None) -> int | None:
    """At the start of ``epoch`` (at ``step``): the step ``fit()`` ends after if every epoch
    left trains ``steps_per_epoch`` batches; None where either count is not known. A resumed
    epoch trains fewer (the overestimate only makes the policy's end rule act later)."""
    if not epochs or not steps_per_epoch or epochs <= epoch:
        return None
    return step + (epochs - epoch) * steps_per_epoch


def epoch_length(params: dict[str, Any] | None, epoch_iterator: Any | None) -> int | None:
    """Batches per epoch, where known: ``fit()``'s ``params["steps"]``, or, for a dataset of unknown
    length, the epoch iterator's count inferred after a first epoch."""
    steps = params.get("steps") if params else None
    if steps is None and epoch_iterator is not None:
        steps = getattr(epoch_iterator, "num_batches", None)
    return steps


def is_last_batch(batch: int, steps: int | None) -> bool:
    """Whether ``batch`` (0-based) is the epoch's last (False when ``steps`` is not known)."""
    return steps is not None and batch + 1 >= steps
