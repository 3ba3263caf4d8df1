"""Which data iterator ("stream") ``fit()`` draws from, and how far: the data half of a resume point.

For the batches a resumed epoch skips to be the same batches, its data must come in the same
order. Keras draws that order when the epoch's iterator is created, from a global generator
(array inputs: torch's on the torch backend, numpy's on JAX; ``PyDataset``: Python's
``random``; torch ``DataLoader``: torch's) or from an op-seeded ``tf.random.shuffle`` (array inputs on
TensorFlow: the same order in every process once a global seed is set). So the generators
are captured when each *stream* (one data iterator) starts and restored at the same point of
the resumed run, before that iterator is created. A stream is one epoch unless
``steps_per_epoch`` makes epochs share one iterator (a repeated dataset, or
``steps_per_epoch`` smaller than the data); :class:`DataStream` follows that, so the position
is "stream k, batch p" and the skip (:mod:`autockpt_keras.skipping`) also covers batches of
earlier epochs of the same stream.

A tf.data dataset that reshuffles on every iteration (``.shuffle()`` default) gives its k-th
iterator in a process the k-th order; a new process starts again at the first. Resuming in a
stream whose iterator was the k-th therefore first creates and drops k iterators
(:func:`advance_dataset`).

Keras internals used (through :mod:`autockpt_keras.internals`): the local ``epoch_iterator`` of
``fit()`` (``internals.find_epoch_iterator``), its ``_get_iterator``, ``_current_iterator``,
``_steps_seen`` and ``_num_batches``. Without the epoch iterator or one of the first three,
every epoch is assumed to start a new stream.

Call order: ``internals.find_epoch_iterator`` and a new :class:`DataStream` in ``on_train_begin``;
the stream's methods from the hooks (see :class:`DataStream`); :func:`advance_dataset` in the
resumed epoch's ``on_epoch_begin``. Everything here runs on the training thread, inside
``fit()``'s hooks and its creation of data iterators.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

from autockpt_core.internals_door import PatchStack

from . import internals
from .resume_point import ResumePoint


@dataclasses.dataclass(frozen=True)
class StreamState:
    """Where the data stream stands (see :class:`~autockpt_keras.resume_point.ResumePoint` for the fields)."""

    iterators_before: int
    position: int
    rng: dict[str, Any]
    rng_first_draw: dict[str, Any] | None


class _AfterIter:
    """Iterable that runs ``after()`` right after ``iter(source)`` (before the first draw)."""

    def __init__(self, source: Any, after: Callable[[], None]) -> None:
        self._source, self._after = source, after

    def __iter__(self) -> Any:
        iterator = iter(self._source)
        self._after()
        return iterator


class DataStream:
    """Which data iterator (stream) ``fit()`` draws from, and how far, across the training.

    Keras creates an epoch's iterator lazily, at the epoch's first batch, unless
    ``steps_per_epoch`` is set and the previous epoch's iterator is not exhausted (then the
    epoch continues it). After an epoch that used up a sized input it also creates the next
    iterator right away (used by the next epoch only with ``steps_per_epoch``; otherwise
    dropped). To count those creations, the epoch iterator's ``_get_iterator`` is wrapped for
    the duration of ``fit()``, through the callback's ``patches`` (:meth:`close` unwraps it).

    ``index`` is what a resumed run must replay to get the same order from a reshuffling
    tf.data input: the number of tf.data iterators created before the current stream's. On
    the TensorFlow backend every Keras iterator is one; on the torch backend a tf.data
    iterator is created only when a stream is first drawn from.

    Call order (training thread): ``epoch_begin`` in ``on_epoch_begin`` (``resume`` instead
    for the resumed epoch), ``batch_end`` in every ``on_train_batch_end`` (skipped batches
    included), ``close`` in ``on_train_end``.
    """

    def __init__(
        self,
        epoch_iterator: Any | None,
        capture: Callable[[], dict[str, Any]],
        backend: str,
        patches: PatchStack | None = None,
    ) -> None:
        if not internals.follows_streams(epoch_iterator):
            epoch_iterator = None  # check_internals named what is missing
        self._ei = epoch_iterator
        self._patches = patches if patches is not None else PatchStack()
        self._steps_seen = internals.attr("steps_seen")
        self._capture = capture
        self._by_creation = backend == "tensorflow" and epoch_iterator is not None
        self.created = 0  # Keras data iterators created since training began (this timeline)
        self.drawn = 0  # streams drawn from since training began
        self.index = 0
        self.rng: dict[str, Any] | None = None
        self.rng_first: dict[str, Any] | None = None
        self._after_next_creation: Callable[[], None] | None = None
        self._undrawn = False  # the current stream has not given a batch yet
        self._fresh = False  # ... and is not even created (Keras creates it at the next batch)
        self._created_seen: int | None = None  # ``created`` at the last batch end
        self._pending_rng: dict[str, Any] | None = None
        self._epoch_batches = 0
        self._exhausts_at: int | None = None  # the epoch iterator's ``_steps_seen`` at its last batch
        self._tf_dataset = _tf_dataset(epoch_iterator)
        self._wrapped = self._hook(epoch_iterator) if epoch_iterator is not None else None

    def _hook(self, ei: Any) -> Any:
        original = internals.read(ei, "get_iterator")

        def counting_get_iterator() -> Any:
            self.created += 1
            if self._by_creation:
                _count_tf_iterator(self._tf_dataset)
            after, self._after_next_creation = self._after_next_creation, None
            source = original()
            return source if after is None else _AfterIter(source, after)

        return self._patches.set(ei, internals.attr("get_iterator"), counting_get_iterator)

    def close(self) -> None:
        """Unwrap the epoch iterator (end of ``fit()``)."""
        self._patches.undo(self._wrapped)
        self._wrapped = None

    def release(self) -> None:
        """After :meth:`close` and the final checkpoint: forget the epoch iterator."""
        self._ei = None

    def epoch_begin(self) -> None:
        """Note whether this epoch starts a new stream; if so, capture the generators for it."""
        eager = self._recreated()
        if self._starts_new():
            now = self._capture()
            if eager and self._pending_rng is not None:
                self.rng, self.rng_first = self._pending_rng, now
            else:
                self.rng, self.rng_first = now, None
            self._undrawn = True
            self._fresh = not eager
        self._pending_rng = None
        self._epoch_batches = 0
        self._exhausts_at = self._last_step_seen()

    def resume(self, point: ResumePoint, after_creation: Callable[[], None] | None = None) -> None:
        """The resumed epoch re-creates the checkpoint's stream (its iterator is built lazily);
        ``after_creation`` runs right after that iterator is created, before its first draw."""
        self.created = self.drawn = self.index = point.iterators_before
        self.rng = point.rng_stream
        self.rng_first = point.rng_first_draw
        self._after_next_creation = after_creation
        self._undrawn = self._fresh = True
        self._created_seen = None
        self._pending_rng = None
        self._epoch_batches = 0
        self._exhausts_at = self._last_step_seen()

    def batch_end(self) -> None:
        """After a batch: the stream exists; capture the generators if Keras is about to
        replace an exhausted iterator (that happens right after this batch's callbacks).
        Every batch: a few attribute reads and stores (the step-end hook's hot path)."""
        if self._undrawn:
            self._first_drawn()
        self._fresh = False
        self._epoch_batches += 1
        self._created_seen = self.created
        exhausts_at = self._exhausts_at
        if exhausts_at is not None and getattr(self._ei, self._steps_seen) >= exhausts_at:
            self._pending_rng = self._capture()

    def _first_drawn(self) -> None:
        self._undrawn = False
        self.drawn += 1
        self.index = self.created - 1 if self._by_creation else self.drawn - 1
        if not self._by_creation:  # torch: a tf.data input's iterator is made at the first draw
            _count_tf_iterator(self._tf_dataset)

    def _last_step_seen(self) -> int | None:
        """Where this epoch's batches use up a sized input that later epochs continue
        (``steps_per_epoch`` set): the iterator's ``_steps_seen`` at its last batch. Keras
        changes ``_num_batches`` only when an iterator runs out or is reset, between epochs."""
        ei = self._ei
        if ei is None or not ei.steps_per_epoch:
            return None
        return internals.num_batches(ei)

    def current(self) -> StreamState:
        """The stream the next batch comes from: index, batches drawn, generators at its start."""
        if self._undrawn:
            return StreamState(self._upcoming_index(created=not self._fresh), 0, self._rng(), self.rng_first)
        pos = self._epoch_batches if self._ei is None else int(getattr(self._ei, self._steps_seen))
        return StreamState(self.index, pos, self._rng(), self.rng_first)

    def next_epoch(self) -> StreamState:
        """Like :meth:`current`, for the epoch after the one that just ended, without changing
        anything (for the final checkpoint)."""
        eager = self._recreated()
        if self._starts_new():
            now = self._capture()
            if eager and self._pending_rng is not None:
                return StreamState(self._upcoming_index(created=True), 0, self._pending_rng, now)
            return StreamState(self._upcoming_index(created=False), 0, now, None)
        return self.current()

    def _rng(self) -> dict[str, Any]:
        return self.rng if self.rng is not None else self._capture()

    def _upcoming_index(self, created: bool) -> int:
        if self._by_creation:
            return self.created - 1 if created else self.created
        return self.drawn

    def _starts_new(self) -> bool:
        ei = self._ei
        if ei is None or ei.steps_per_epoch is None or internals.current_iterator(ei) is None:
            return True
        return self._recreated()

    def _recreated(self) -> bool:
        ei = self._ei
        return (
            ei is not None
            and ei.steps_per_epoch is not None
            and internals.current_iterator(ei) is not None
            and self._created_seen is not None
            and self.created != self._created_seen  # an iterator created after the last batch
        )


# -- tf.data iterators created in this process ---------------------------------------------------


# tf.data iterators this process created per dataset object (counted by DataStream and
# advance_dataset), so a second fit() on the same object in one process does not advance it twice.
_TF_ITERATORS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _tf_dataset(epoch_iterator: Any | None) -> Any | None:
    if epoch_iterator is None or type(epoch_iterator.data_adapter).__name__ != "TFDatasetAdapter":
        return None
    return internals.tf_dataset(epoch_iterator.data_adapter)


def _count_tf_iterator(dataset: Any | None) -> None:
    if dataset is not None:
        try:
            _TF_ITERATORS[dataset] = _TF_ITERATORS.get(dataset, 0) + 1
        except TypeError:  # not weak-referenceable: not counted
            pass


def advance_dataset(epoch_iterator: Any | None, count: int) -> int:
    """Create and drop iterators of a tf.data input until ``count`` were created in this
    process, so its reshuffling seed stands where the interrupted run's stood. Returns how
    many were created now."""
    dataset = _tf_dataset(epoch_iterator)
    if dataset is None:
        return 0
    try:
        missing = count - _TF_ITERATORS.get(dataset, 0)
    except TypeError:
        missing = count
    for _ in range(max(0, missing)):
        iterator = iter(dataset)
        del iterator
        _count_tf_iterator(dataset)
    return max(0, missing)
