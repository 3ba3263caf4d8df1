"""Where a decision is made: when to checkpoint, from measurements (pure, no I/O, no clock).

- :mod:`.profiler`: online estimates of iteration time, stall, persist time and bytes.
- :mod:`.intervals`: Young, Daly, the budget and persist bounds (formulas).
- :mod:`.decision`: :func:`choose_interval` and :class:`CheckpointPolicy` (the per-step answer).
- :mod:`.adaptive`, :mod:`.frontload` (with :mod:`.losscurve`), :mod:`.adjusters`: interval
  adjusters (re-tuning, the front-loaded schedule) and how the config selects them.
- :mod:`.checkpoint_cost`, :mod:`.mode_trial`: what one checkpoint cost the training, and
  ``snapshot_mode="auto"``'s choice of copy mode from those costs.
- :mod:`.simulate`, :mod:`.dryrun`: policies under simulated failures; the real policy on a
  fake clock. :mod:`.stats`: small statistics helpers.

Imports only ``autockpt_core``'s base modules (config, units, errors); never the persist
path, the engine or the command line.
"""

from .decision import (
    Adjuster,
    AdjusterSpec,
    CheckpointPolicy,
    Decision,
    IntervalAdjuster,
    IntervalChoice,
    IntervalRules,
    choose_interval,
)
from .profiler import Estimates, Profiler

__all__ = [
    "Adjuster",
    "AdjusterSpec",
    "CheckpointPolicy",
    "Decision",
    "Estimates",
    "IntervalAdjuster",
    "IntervalChoice",
    "IntervalRules",
    "Profiler",
    "choose_interval",
]
