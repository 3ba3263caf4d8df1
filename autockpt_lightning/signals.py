"""Taking SIGTERM over from Lightning's signal connector (rather than chaining to it).

Lightning 2.x registers its own SIGTERM handler when ``fit()`` starts (after ``on_fit_start``).
That handler forwards the signal to the launcher's child processes, runs a
``dist.broadcast`` inside the signal handler under DDP (which can leave the ranks waiting in
mismatched collectives), and sets ``trainer.received_sigterm``, on which the loops raise
``SIGTERMException`` — a ``SystemExit`` with status 0, before the emergency checkpoint, even
from inside validation. autockpt instead records SIGTERM in its own handler and acts on it
at the next step boundary, with every rank agreeing in the per-step all-reduce.

Call order (training thread, every rank): ``take_sigterm(trainer)`` in ``on_fit_start``,
after autockpt's handler is installed, so the connector composes autockpt's handler (and
whatever was installed before it) without its own notifier; ``hand_back(trainer, handler)``
when the fit ends, normally (``on_fit_end``) or not (``on_exception``): it uninstalls
autockpt's handler and makes the connector's teardown, which puts back the handlers it found
(autockpt's among them), put back the ones autockpt found instead.
"""

from __future__ import annotations

import logging
from types import FrameType
from typing import Any

import lightning.pytorch as pl

from autockpt_core import PreemptionHandler

from . import internals

log = logging.getLogger("autockpt")



def _left_to_autockpt(signum: Any, frame: FrameType | None) -> None:
    """Stands in for Lightning's SIGTERM notifier: autockpt's own handler records the signal."""
    log.debug("autockpt: SIGTERM left to autockpt's handler (Lightning's notifier is not called)")


def take_sigterm(trainer: pl.Trainer) -> bool:
    """Make the connector register ``_left_to_autockpt`` instead of its notifier; False if unsupported."""
    connector = internals.signal_connector(trainer)
    notifier = internals.INTERNALS["sigterm_notifier"]
    if connector is None or not callable(internals.read(connector, "sigterm_notifier")):
        log.warning(
            "autockpt: this Lightning has no %s; its own SIGTERM handling stays on and may stop training "
            "before the emergency checkpoint",
            notifier.label,
        )
        return False
    setattr(connector, notifier.attr, _left_to_autockpt)
    return True


def hand_back(trainer: pl.Trainer, handler: PreemptionHandler | None) -> None:
    """Undo :func:`take_sigterm` and uninstall ``handler``, also in the connector's teardown list."""
    connector = internals.signal_connector(trainer)
    if connector is not None:
        vars(connector).pop(internals.INTERNALS["sigterm_notifier"].attr, None)
    if handler is None:
        return
    originals = internals.read(connector, "original_handlers") if connector is not None else None
    if isinstance(originals, dict):
        for signum, installed in list(originals.items()):
            if handler.owns(installed):
                originals[signum] = handler.previous(int(signum))
    handler.uninstall()
