"""Skipping a resumed epoch's batches by index: a ``PyDataset`` does not load them again.

:class:`~autockpt_keras.skipping.SkipSteps` draws each batch the resumed epoch already
trained from ``fit()``'s iterator, so everything the data pipeline does per batch stays in
step with the interrupted run. For a ``PyDataset`` read in this process (no ``workers``), the
draw that matters is the adapter's walk through the (shuffled) batch indices, not the loading:
:class:`IndexSkip` stands in for the adapter's dataset for the stream's first ``count``
lookups and answers them with one batch, loaded once (the first skipped index), so the walk,
the shuffle and Keras' own counting are unchanged and the dataset's ``__getitem__`` runs for
one skipped batch instead of all of them.

A ``__getitem__`` that draws from Python's or numpy's global generator is still exact on the
torch and JAX backends: the generators are set to their state at the checkpoint after the
skip, before the next batch is loaded. On TensorFlow, ``tf.data`` loads batches ahead in its
own thread, before that moment, so such draws must happen in sequence: :class:`IndexSkip`
compares both generators around the one load and, if they moved, loads the remaining skipped
batches too (and says so). A dataset with a generator object of its own is not exact across
processes either way (a new process builds it afresh).

Other inputs are drawn (:func:`skip_plan` says why): arrays (a slice of memory per batch),
``tf.data`` (an iterator cannot jump ahead without computing), a ``PyDataset`` with workers
(its threads or processes load ahead, out of order), a torch ``DataLoader``, a generator.

Keras internals used (checked against Keras 3.15's TensorFlow, torch and JAX trainers):
``PyDatasetAdapter.py_dataset``, read at every lookup of its generator, and ``enqueuer``.

Call order: :func:`skip_plan` when the checkpoint is restored (``on_train_begin``); an
:class:`IndexSkip` installed in the resumed epoch's ``on_epoch_begin`` (before the epoch's
iterator exists), uninstalled when the skip ends or in ``on_train_end``. Lookups run on the
thread that loads batches (TensorFlow: ``tf.data``'s; torch and JAX: the training thread).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

from autockpt_core import rng as core_rng


@dataclasses.dataclass(frozen=True)
class SkipPlan:
    """How a resumed epoch skips the batches it already trained: ``by_index`` (only one of
    them is loaded) or drawn; ``reason``: why they are drawn ('' when by index)."""

    by_index: bool
    reason: str = ""

    def describe(self, batches: int) -> str:
        if self.by_index:
            return f"skipping the {batches} batch(es) already trained by index: only the first is loaded"
        return f"drawing the {batches} batch(es) already trained ({self.reason})"


def skip_plan(epoch_iterator: Any | None, inputs_kind: str) -> SkipPlan:
    """Whether ``fit()``'s input lets a resumed epoch skip by index (see the module docstring)."""
    adapter = getattr(epoch_iterator, "data_adapter", None)
    if inputs_kind == "PyDataset" and adapter is not None:
        if getattr(adapter, "enqueuer", None) is not None:
            return SkipPlan(False, "a PyDataset with workers loads ahead in its own threads or processes")
        if hasattr(adapter, "py_dataset"):
            return SkipPlan(True)
    reasons = {
        "arrays": "array batches are slices of memory",
        "tf.data": "a tf.data iterator cannot jump ahead without computing",
        "torch DataLoader": "a torch DataLoader is drawn through its own iterator",
        "generator": "a generator can only be drawn",
    }
    return SkipPlan(False, reasons.get(inputs_kind, f"{inputs_kind} input"))


class IndexSkip:
    """Stands in for a ``PyDataset`` adapter's dataset for the first ``count`` lookups of the
    stream about to start; see the module docstring.

    ``check_generators``: compare Python's and numpy's global generators around the one load
    and load every skipped batch if they moved (the TensorFlow backend). ``say``: called once
    with a message when that happens. Counts: ``served`` (lookups answered without loading),
    ``loaded`` (skipped lookups that loaded).
    """

    def __init__(
        self, adapter: Any, count: int, *, check_generators: bool, say: Callable[[str], None] | None = None
    ) -> None:
        self.adapter = adapter
        self.original = adapter.py_dataset
        self.remaining = int(count)
        self.check_generators = check_generators
        self.say = say
        self.served = 0
        self.loaded = 0
        self._stand_in: Any = None
        self._load_all = False
        self._lock = threading.Lock()

    def install(self) -> None:
        if self.remaining > 0:
            self.adapter.py_dataset = _Lookup(self)

    def uninstall(self) -> None:
        if isinstance(self.adapter.py_dataset, _Lookup):
            self.adapter.py_dataset = self.original

    def lookup(self, index: Any) -> Any:
        with self._lock:
            if self.remaining <= 0:  # a lookup that was under way while the skip ended
                return self.original[index]
            self.remaining -= 1
            if self.remaining == 0:
                self.uninstall()
            if self._stand_in is not None and not self._load_all:
                self.served += 1
                return self._stand_in
            self.loaded += 1
            if self._load_all:
                return self.original[index]
            before = core_rng.capture_rng() if self.check_generators else None
            batch = self.original[index]
            if before is not None and core_rng.capture_rng() != before:
                self._load_all = True
                if self.say is not None:
                    self.say(
                        f"autockpt: {type(self.original).__name__}.__getitem__ draws from Python's or numpy's "
                        f"global generator; on the TensorFlow backend the {self.remaining} other skipped "
                        "batch(es) are loaded too, so those draws stay in sequence"
                    )
            self._stand_in = batch
            return batch


class _Lookup:
    """The adapter's ``py_dataset`` while :class:`IndexSkip` is installed: lookups go through
    it, every other attribute to the user's dataset."""

    def __init__(self, skip: IndexSkip) -> None:
        self._skip = skip

    def __getitem__(self, index: Any) -> Any:
        return self._skip.lookup(index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._skip.original, name)
