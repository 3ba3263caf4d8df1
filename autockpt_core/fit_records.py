"""``FitRecords``: what the current (or last) ``fit()``'s driver recorded, as a callback's attributes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .checkpoint_event import CheckpointEvent
from .preemption import PreemptionRecord
from .summary import RunSummary

if TYPE_CHECKING:
    from .fit_driver import FitDriver

__all__ = ["FitRecords"]


class FitRecords:
    """A base of both callbacks, which keep their driver in ``_driver``; empty before a fit."""

    _driver: FitDriver | None = None

    @property
    def events(self) -> list[CheckpointEvent]:
        """The checkpoints taken, as :class:`CheckpointEvent` records (process 0)."""
        return self._driver.events if self._driver is not None else []

    @property
    def resumed_from(self) -> int | None:
        """The step a resume restored, or None."""
        return self._driver.resumed_from if self._driver is not None else None

    @property
    def preempted(self) -> PreemptionRecord | None:
        """A :class:`PreemptionRecord` after a signal, else None."""
        return self._driver.preempted if self._driver is not None else None

    @property
    def summary(self) -> RunSummary | None:
        """The :class:`RunSummary` once the session finished (process 0), else None."""
        return self._driver.summary if self._driver is not None else None
