"""A signal during validation, acted on at the next validation batch with an exact checkpoint.

Lightning validates between two training steps (after an epoch's last batch, or every
``val_check_interval``), for as long as the validation data takes: a signal that waited for the
next training step could outlast the grace window. The callback's ``on_validation_batch_start``
calls ``FitDriver.outside_step``, which acts on a signal there: the checkpoint of the last
trained step, committed, then the exit.

That checkpoint resumes exactly (measured on Lightning 2.6.6: a stateful loader, a
``ResumableSampler`` with and without workers, a stream without a length; validation mid-epoch
and at an epoch's end; on 2.5.1, mid-epoch). Two things make it so:

- its loops' state is the one Lightning restarts an interrupted validation from
  (``RESTARTED_MID_EVALUATION``: the validation loop counted inside a batch, which
  :meth:`ValidationWatch.inside_batch` sets for the dump): the resumed fit runs the
  interrupted validation again before it trains (from a new iterator, for the batches it had
  left: Lightning counts those done), instead of skipping it;
- the generators it holds are those of the last step's end, which :class:`ValidationWatch`
  keeps when a validation begins: the validation loader's iterator draws its seed from torch's
  generator before any validation hook runs, and the rerun validation draws it again.

Not exact: the validation after an epoch's last batch of a train loader without a length (the
resumed fit fetches the next epoch's first batch ahead and drops it), and after any epoch's
last batch before Lightning 2.6 (2.5.1 measured). That checkpoint is taken all the same (it holds the newest work), marked in the manifest
(``not_exact``), and a resume from it warns (``ResumeNotExactWarning``).

Call order (training thread, one process: with several the driver waits for the next step):
``watch(trainer)`` at ``on_train_start`` (each validation's ``run()`` then keeps the
generators while it runs); :attr:`rng`, :attr:`inexact` and :meth:`inside_batch`, used by the
callback's ``_take``; ``stop()`` when the fit ends or raises. The sanity check runs before
``watch``: nothing is trained then, so a signal there exits without a checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import lightning.pytorch as pl

from autockpt_core.internals_door import PatchStack

from . import internals


class ValidationWatch:
    """Keeps every rank's generator states from the start of the running validation.

    ``gather(trainer)``: the states by global rank, as the checkpoint's callback entry holds them.
    """

    def __init__(self, gather: Callable[[pl.Trainer], dict[int, dict[str, Any]]]) -> None:
        self._gather = gather
        self._patches = PatchStack()
        self.rng: dict[int, dict[str, Any]] | None = None  # while a validation runs in training
        self.inexact: str | None = None  # why a checkpoint taken in it cannot resume exactly, if so

    def watch(self, trainer: pl.Trainer) -> None:
        """Wrap the fit's validation loop's ``run`` (one process; a no-op where the loop is missing)."""
        self.stop()
        loop = internals.validation_loop(trainer)
        if loop is None or trainer.world_size > 1:
            return
        run = loop.run

        def run_keeping_the_generators() -> Any:
            self.rng = self._gather(trainer)
            self.inexact = _inexact_after(trainer)
            try:
                return run()
            finally:
                self.rng, self.inexact = None, None

        self._patches.set(loop, "run", run_keeping_the_generators)

    @contextlib.contextmanager
    def inside_batch(self, trainer: pl.Trainer) -> Iterator[None]:
        """While a checkpoint is dumped during validation: the validation loop's progress as
        inside the batch that starts (its ``started`` count, put back after), the state
        Lightning's loops restart an interrupted validation from. Elsewhere: nothing."""
        loop = internals.validation_loop(trainer) if self.rng is not None else None
        progress = getattr(loop, "batch_progress", None)
        if progress is None:
            yield
            return
        progress.increment_started()
        try:
            yield
        finally:
            progress.total.started -= 1
            progress.current.started -= 1

    def stop(self) -> None:
        self._patches.undo_all()
        self.rng, self.inexact = None, None


EXACT_AT_EPOCH_END = tuple(int(part) for part in pl.__version__.split(".")[:2]) >= (2, 6)
"""Whether this Lightning resumes exactly from a checkpoint taken in the validation after an
epoch's last batch (measured: 2.6.6 does, 2.5.1 does not; mid-epoch validation both do)."""


def _inexact_after(trainer: pl.Trainer) -> str | None:
    """Why a checkpoint taken in the validation starting now cannot resume exactly, if so: after
    an epoch's last batch of a train loader without a length (the resumed fit fetches the next
    epoch's first batch ahead and drops it), or of any loader before Lightning 2.6."""
    if not internals.at_epochs_last_batch(trainer):
        return None
    if math.isinf(trainer.num_training_batches):
        return "taken during the validation after an epoch's last batch of a train loader without a length"
    if not EXACT_AT_EPOCH_END:
        return (f"taken during the validation after an epoch's last batch, which Lightning {pl.__version__} "
                "does not resume from exactly (2.6 does)")
    return None
