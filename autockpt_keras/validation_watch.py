"""A signal during ``fit()``'s validation, acted on at the next validation batch, exactly.

Keras validates after an epoch's last batch (``validation_data``), through ``evaluate()`` with
``fit()``'s callbacks: ``on_test_begin``, then ``on_test_batch_begin``/``_end`` per batch. A
signal that waited for the next epoch's start could outlast the grace window. At each
validation batch's start the callback calls ``FitDriver.outside_step``, which acts on a signal
there: the checkpoint of the last trained step, committed, then the exit.

That checkpoint holds the resume point of the epoch's last batch as it was at that batch's end
(:attr:`ValidationWatch.point`), the point an emergency checkpoint at that batch holds: the
resumed run draws the epoch's batches without training on them, runs the interrupted
validation again from its first batch, and goes on; the weights end bitwise equal to an
uninterrupted run where resuming is exact (docs/reliability.md). The point is kept at the
batch's end because the generators move before ``on_test_begin``: on the torch backend
``evaluate()`` starts the validation data's ``DataLoader`` there, which draws its seed from
torch's generator. Where the epoch's length is not known yet (a dataset of unknown length, in
its first epoch), the point is taken at ``on_test_begin``: exact where nothing drew before it.

Call order (training thread): ``start`` at ``on_train_begin``, once the handlers are
installed; ``last_batch`` at an epoch's last trained batch (a few hundred microseconds, once
per epoch, only while watching); ``begin`` at ``on_test_begin``; ``batch_begin`` at every
``on_test_batch_begin``; ``end`` at ``on_test_end``; :attr:`point`, read by the callback's
``_position`` while a validation runs. Only in a ``fit()`` that listens for signals (an
``evaluate()`` of the user's, outside ``fit()``, is not watched), on one process: with several
the driver waits for the next step.
"""

from __future__ import annotations

from typing import Callable

from autockpt_core import PreemptionHandler
from autockpt_core.fit_driver import FitDriver

from .resume_point import ResumePoint

PointOf = Callable[[], ResumePoint]
"""The resume point after the last trained batch, now."""


class ValidationWatch:
    """The resume point of the epoch's last trained batch while ``fit()``'s validation runs."""

    def __init__(self) -> None:
        self.watching = False  # fit() listens for signals on one process
        self.point: ResumePoint | None = None  # while a validation runs
        self._driver: FitDriver | None = None
        self._kept: tuple[tuple[int, int], ResumePoint] | None = None  # (epoch, batch) and its point

    def start(self, preemption: PreemptionHandler | None, driver: FitDriver) -> None:
        self.watching = preemption is not None and preemption.installed and driver.group.count == 1
        self._driver = driver if self.watching else None

    def last_batch(self, epoch: int, batch: int, point: PointOf) -> None:
        """An epoch's last trained batch ended: keep its resume point for the validation next."""
        self._kept = ((epoch, batch), point())

    def begin(self, epoch: int, batch: int | None, point: PointOf) -> None:
        """``on_test_begin`` inside ``fit()``, after ``batch`` of ``epoch`` (None: none trained)."""
        kept, self._kept = self._kept, None
        if not self.watching or batch is None:
            return
        self.point = kept[1] if kept is not None and kept[0] == (epoch, batch) else point()

    def batch_begin(self, step: int) -> None:
        """``on_test_batch_begin``: a signal is acted on now (``step``: the last trained)."""
        if self.point is not None and self._driver is not None:
            self._driver.outside_step(step)

    def end(self) -> None:
        self.point = None
