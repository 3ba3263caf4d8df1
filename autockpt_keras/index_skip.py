"""Skipping a resumed epoch's batches by index: a ``PyDataset`` or a torch ``DataLoader`` does
not load them again.

:class:`~autockpt_keras.skipping.SkipSteps` draws each batch the resumed epoch already
trained from ``fit()``'s iterator, so everything the data pipeline does per batch stays in
step with the interrupted run. For two inputs read in this process, the draw that matters is
the walk through the (shuffled) batch indices, not the loading:

- a ``PyDataset`` without ``workers``: :class:`IndexSkip` stands in for the adapter's dataset
  for the stream's first ``count`` lookups and answers them with one batch, loaded once (the
  first skipped index), so the walk, the shuffle and Keras' own counting are unchanged;
- a torch ``DataLoader`` without workers over a map-style dataset: :class:`IndexSkip` stands in
  for the adapter's loader until the stream's iterator is created; that iterator is the
  loader's own, and for its first ``count`` batches it loads the first and then only takes
  the next indices from the loader's sampler (``_next_index``, as the loader itself does
  before each load), so the sampler, its generator and the loader's base seed draw exactly as
  in the interrupted run;
- arrays on the torch backend: Keras makes a ``DataLoader`` over them (a batch sampler, shuffled
  by torch's generator) for each epoch; :class:`IndexSkip` stands in for the adapter's
  ``get_torch_dataloader`` until it made the resumed stream's loader, which is then skipped
  as above;
- a torch ``DataLoader`` with workers (and no ``worker_init_fn``) over a map-style dataset:
  while its iterator is created, a :class:`_SkippingSampler` stands in for its index sampler.
  The iterator's first prefetch draws the first skipped batch's indices through it; that batch
  is loaded in this process (:meth:`IndexSkip.probe`), the other skipped batches' indices are
  drawn and dropped, and only the rest reach the workers. The sampler and the base seed of
  the workers draw as in the interrupted run; the workers get other batches than they did
  (worker ``i`` no longer loads batch ``i`` of the epoch), which changes nothing for a dataset
  whose loads draw from no generator, and the probe shows whether they do.

Either way the dataset's ``__getitem__`` runs for one skipped batch instead of all of them.

A dataset that draws from Python's, numpy's or torch's global generator as it loads is still
exact on the torch and JAX backends: the generators are set to their state at the checkpoint
after the skip, before the next batch is loaded. On TensorFlow, ``tf.data`` loads batches ahead
in its own thread, before that moment, so such draws must happen in sequence: :class:`IndexSkip`
compares those generators around the one load (for a ``DataLoader``, after its index is drawn)
and, if they moved, loads the remaining skipped batches too (and says so). A ``DataLoader``'s
workers draw in processes of their own, on every backend: the probe's load is watched the same
way and, if it drew (or failed outside a worker), the generators are put back and the workers
load every skipped batch. A dataset with a generator object of its own is not exact across
processes either way (a new process builds it afresh); a ``worker_init_fn`` may give each
worker one, so such a loader is drawn.

Other inputs are drawn (:func:`skip_plan` says why): arrays on TensorFlow and JAX (a slice of
memory per batch, cut inside tf.data's graph or by a generator of Keras' own),
``tf.data`` (an iterator cannot jump ahead without computing), a ``PyDataset`` with workers
(Keras' enqueuer loads ahead in its own threads or processes), a ``DataLoader`` with workers
and a ``worker_init_fn`` or with an iterator of another kind (torchdata's
``StatefulDataLoader``), a ``DataLoader`` over an ``IterableDataset``, a generator.

Keras internals used (the private ones through :mod:`autockpt_keras.internals`):
``PyDatasetAdapter.py_dataset``, read at every lookup of its generator, and ``enqueuer``;
``TorchDataLoaderAdapter._dataloader``, iterated once per stream; on torch, the epoch
iterator's call of ``ArrayDataAdapter.get_torch_dataloader`` once per stream; the stand-in is
set through the callback's patch stack. torch internals (and torchdata's
``StatefulDataLoader``): the single-process iterator's ``_next_index`` and ``_num_yielded``, an iterator without them is drawn; for workers, that an iterator reads the
loader's ``batch_sampler`` (``sampler`` without batching) when it is created and draws its
first indices before it is returned, and ``_DatasetKind.create_fetcher`` with the loader's
``_auto_collation`` (the load the workers make; without them the workers load every skipped
batch); an iterator that had not drawn through the stand-in by then is drawn.

Call order: :func:`skip_plan` when the checkpoint is restored (``on_train_begin``); an
:class:`IndexSkip` installed in the resumed epoch's ``on_epoch_begin`` (before the epoch's
iterator exists), uninstalled when the skip ends (a ``DataLoader``: when its iterator is
created; arrays on torch: when the loader is made) or in ``on_train_end``. Lookups and loads run on the thread that loads batches
(TensorFlow: ``tf.data``'s; torch and JAX: the training thread).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Callable, Iterator

from autockpt_core.internals_door import Patch, PatchStack

from . import internals
from .rng import capture_shared, restore_shared

log = logging.getLogger("autockpt")

# torch's own iterators, which have the internals a skip by index uses (others are drawn)
_TORCH_ITERATORS = ("_SingleProcessDataLoaderIter", "_MultiProcessingDataLoaderIter")


@dataclasses.dataclass(frozen=True)
class SkipPlan:
    """How a resumed epoch skips the batches it already trained: ``by_index`` (only one of
    them is loaded) or drawn; ``reason``: why they are drawn ('' when by index)."""

    by_index: bool
    reason: str = ""

    def describe(self, batches: int) -> str:
        if self.by_index:
            return f"the {batches} batch(es) already trained are skipped by index, only the first is loaded"
        return f"the {batches} batch(es) already trained are drawn, not trained, as {self.reason}"


def skip_plan(epoch_iterator: Any | None, inputs_kind: str, backend: str = "") -> SkipPlan:
    """Whether ``fit()``'s input lets a resumed epoch skip by index (see the module docstring);
    ``backend``: Keras' (arrays skip by index on torch only)."""
    adapter = getattr(epoch_iterator, "data_adapter", None)
    if inputs_kind == "arrays" and backend == "torch" and callable(getattr(adapter, "get_torch_dataloader", None)):
        return SkipPlan(True)
    if inputs_kind == "PyDataset" and adapter is not None:
        if getattr(adapter, "enqueuer", None) is not None:
            return SkipPlan(False, "a PyDataset with workers loads ahead in its own threads or processes")
        if hasattr(adapter, "py_dataset"):
            return SkipPlan(True)
    loader = internals.torch_dataloader(adapter) if adapter is not None else None
    if inputs_kind == "torch DataLoader" and loader is not None:
        reason = _loader_reason(loader)
        return SkipPlan(not reason, reason)
    reasons = {
        "arrays": "array batches are slices of memory, cut by Keras' own pipeline on this backend "
        "(tf.data's graph on TensorFlow, a generator on JAX)",
        "tf.data": "a tf.data iterator cannot jump ahead without computing",
        "torch DataLoader": "a torch DataLoader is drawn through its own iterator",
        "generator": "a generator can only be drawn",
    }
    return SkipPlan(False, reasons.get(inputs_kind, f"{inputs_kind} input can only be drawn"))


def _loader_reason(loader: Any) -> str:
    """Why a torch ``DataLoader`` is drawn ('' if it can skip by index)."""
    from torch.utils.data import DataLoader, IterableDataset

    if isinstance(getattr(loader, "dataset", None), IterableDataset):
        return "a DataLoader over an IterableDataset can only be drawn"
    if _has_workers(loader):
        if type(loader).__iter__ is not DataLoader.__iter__ or type(loader)._get_iterator is not DataLoader._get_iterator:
            return f"a {type(loader).__name__} with workers loads ahead in worker processes of its own kind"
        if getattr(loader, "worker_init_fn", None) is not None:
            return "a DataLoader with workers and a worker_init_fn: its workers may draw from generators of their own"
    return ""


def _has_workers(loader: Any) -> bool:
    return int(getattr(loader, "num_workers", 0) or 0) > 0


class IndexSkip:
    """Stands in for a ``PyDataset`` adapter's dataset for the first ``count`` lookups of the
    stream about to start, or for a torch ``DataLoader`` adapter's loader until that stream's
    iterator is created; see the module docstring.

    ``check_generators``: compare the global generators around the one load and load every
    skipped batch if they moved (the TensorFlow backend). ``say``: called once with a message
    when that happens. Counts: ``served`` (skipped batches answered without loading),
    ``loaded`` (skipped batches that loaded).
    """

    def __init__(
        self,
        adapter: Any,
        count: int,
        *,
        check_generators: bool,
        say: Callable[[str], None] | None = None,
        patches: PatchStack | None = None,
    ) -> None:
        self.adapter = adapter
        loader = internals.attr("torch_dataloader")
        self._slot = next((s for s in ("py_dataset", loader) if hasattr(adapter, s)), "get_torch_dataloader")
        self._stand_in_kind = {"py_dataset": _Lookup, loader: _FastForward}.get(self._slot, _NextLoader)
        self.original = getattr(adapter, self._slot)
        self._patches = patches if patches is not None else PatchStack()
        self._patch: Patch | None = None
        self.workers = self._stand_in_kind is _FastForward and _has_workers(self.original)
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
            self._patch = self._patches.set(self.adapter, self._slot, self._stand_in_kind(self))

    def uninstall(self) -> None:
        self._patches.undo(self._patch)

    def lookup(self, index: Any) -> Any:
        """A ``PyDataset`` lookup while installed (any thread)."""
        with self._lock:  # each count is updated before ``remaining`` (see fast_forward)
            if self.remaining <= 0:  # a lookup that was under way while the skip ended
                return self.original[index]
            if self._stand_in is not None and not self._load_all:
                self.served += 1
                self._took_one()
                return self._stand_in
            self.loaded += 1
            if self._load_all:
                self._took_one()
                return self.original[index]
            before = capture_shared() if self.check_generators else None
            batch = self.original[index]
            if before is not None and capture_shared() != before:
                self._draws_seen(type(self.original).__name__, self.remaining - 1)
            self._stand_in = batch
            self._took_one()
            return batch

    def _took_one(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.uninstall()

    def fast_forward(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """A ``DataLoader``'s new iterator, its first ``count`` batches skipped by index (one
        thread: the one that iterates)."""
        next_index = internals.read(iterator, "next_index")
        yielded = internals.attr("num_yielded")
        if next_index is None or not internals.has(iterator, "num_yielded"):
            if not self._load_all and type(iterator).__name__ in _TORCH_ITERATORS:
                gone = "next_index" if next_index is None else "num_yielded"
                label = internals.INTERNALS[gone].label
                log.warning("autockpt: this torch has no %s; the skipped batches are drawn", label)
            self._load_all = True  # an iterator of another kind: drawn
        # Each count is updated before ``remaining``: once it reads 0 (another thread may look),
        # the counts are final.
        while self.remaining > 0:
            try:
                if self._stand_in is not None and not self._load_all:
                    next_index()  # type: ignore[misc]  # the index the interrupted run loaded here
                    setattr(iterator, yielded, getattr(iterator, yielded) + 1)
                    self.served += 1
                    self.remaining -= 1
                    yield self._stand_in
                    continue
                batch = next(iterator) if self._load_all or not self.check_generators else self._watched_load(iterator)
            except StopIteration:
                self.remaining = 0
                return
            self.loaded += 1
            self.remaining -= 1
            if self._stand_in is None:
                self._stand_in = batch
            yield batch
        yield from iterator

    def fast_forward_workers(self, loader: Any) -> Iterator[Any]:
        """A ``DataLoader`` with workers: its new iterator, created while a
        :class:`_SkippingSampler` stands in for its index sampler, so the skipped batches'
        indices are passed over before any index reaches a worker (the thread that iterates)."""
        slot = "batch_sampler" if loader.batch_sampler is not None else "sampler"
        view = _SkippingSampler(self, getattr(loader, slot), loader)
        # A DataLoader refuses new samplers once built; its iterator reads the index sampler when
        # it is created (and again at each persistent-workers epoch, which the view passes on).
        object.__setattr__(loader, slot, view)
        try:
            iterator = iter(loader)
        finally:
            object.__setattr__(loader, slot, view.original)
        if not view.passed_over:  # the probe said no, an empty sampler, or persistent workers'
            self._load_all = True  # earlier iterator reset with its own sampler: drawn
        return self._after_passing_over(iterator, view.passed_over)

    def _after_passing_over(self, iterator: Iterator[Any], passed_over: int) -> Iterator[Any]:
        """The stand-in for the ``passed_over`` batches, then the workers' batches (drawn
        through :meth:`fast_forward` where none was passed over)."""
        for position in range(passed_over):
            if position:
                self.served += 1
            else:
                self.loaded += 1  # the stand-in, loaded by :meth:`probe`
            self.remaining -= 1
            yield self._stand_in
        if passed_over:
            self.remaining = 0  # a loader shorter than the skip ends with it
        yield from self.fast_forward(iterator)

    def probe(self, loader: Any, index: Any) -> bool:
        """Load the first skipped batch (``index``) in this process with the loader's own fetcher,
        watching the global generators: True if it stands in for the skipped batches; False
        (said why, the generators put back) if it drew from them or failed, and the workers
        then load every skipped batch, so their draws stay in sequence."""
        before = capture_shared()
        name = type(loader.dataset).__name__
        try:
            fetcher = internals.loader_fetcher(loader)
            if fetcher is None:
                raise LookupError("this torch has no DataLoader fetcher autockpt knows (autockpt_keras.internals)")
            batch = fetcher.fetch(index)
        except Exception as error:  # e.g. state its worker_init_fn would have made: the workers load it
            why = f"{name}'s first skipped batch could not be loaded outside the workers ({type(error).__name__}: {error})"
        else:
            why = "" if capture_shared() == before else f"{name}.__getitem__ draws from Python's, numpy's or torch's global generator"
        if not why:
            self._stand_in = batch
            return True
        restore_shared(before)
        self._load_all = True
        if self.say is not None:
            self.say(f"autockpt: {why}; the DataLoader's workers load the {self.remaining} skipped batch(es)")
        return False

    def _watched_load(self, iterator: Any) -> Any:
        """``next(iterator)``, the generators compared from after its index is drawn (a
        shuffling sampler draws from torch's generator) to after the load."""
        draw_index = internals.read(iterator, "next_index")
        seen: list[Any] = []

        def index_then_watch() -> Any:
            index = draw_index()
            seen.append(capture_shared())
            return index

        patches = PatchStack()
        patches.set(iterator, internals.attr("next_index"), index_then_watch)
        try:
            batch = next(iterator)
        finally:
            patches.undo_all()  # the iterator's own method again
        if seen and capture_shared() != seen[0]:  # this load is still counted in ``remaining``
            self._draws_seen(type(getattr(self.original, "dataset", self.original)).__name__, self.remaining - 1)
        return batch

    def _draws_seen(self, name: str, others: int) -> None:
        self._load_all = True
        if self.say is not None:
            self.say(
                f"autockpt: {name}.__getitem__ draws from Python's, numpy's or torch's global generator; on "
                f"the TensorFlow backend the {others} other skipped batch(es) are loaded too, so those "
                "draws stay in sequence"
            )


class _Lookup:
    """The adapter's ``py_dataset`` while :class:`IndexSkip` is installed: lookups go through
    it, every other attribute to the user's dataset."""

    def __init__(self, skip: IndexSkip) -> None:
        self._skip = skip

    def __getitem__(self, index: Any) -> Any:
        return self._skip.lookup(index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._skip.original, name)


class _FastForward:
    """The adapter's ``_dataloader`` while :class:`IndexSkip` is installed (or the loader its
    ``get_torch_dataloader`` made, ``loader``): the first iterator it gives is the loader's
    own, fast-forwarded; it puts the adapter's loader back as it gives it. Every other
    attribute goes to the loader."""

    def __init__(self, skip: IndexSkip, loader: Any = None) -> None:
        self._skip = skip
        self._loader = skip.original if loader is None else loader

    def __iter__(self) -> Iterator[Any]:
        self._skip.uninstall()
        if self._skip.workers:
            return self._skip.fast_forward_workers(self._loader)
        return self._skip.fast_forward(iter(self._loader))

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)


class _NextLoader:
    """The adapter's ``get_torch_dataloader`` while :class:`IndexSkip` is installed (arrays on
    torch: Keras makes a new ``DataLoader`` over them for each epoch): the next loader it makes
    is handed out as a :class:`_FastForward`, and the adapter's own method is back."""

    def __init__(self, skip: IndexSkip) -> None:
        self._skip = skip

    def __call__(self) -> Any:
        self._skip.uninstall()
        return _FastForward(self._skip, self._skip.original())


class _SkippingSampler:
    """A ``DataLoader``'s index sampler while its iterator with workers is created. Its first pass
    draws the sampler's first index (batch) and has :meth:`IndexSkip.probe` load it; if that
    batch stands in, it draws and drops the other skipped batches' indices before yielding the
    rest, so no worker loads them and the sampler's generator draws as in the interrupted run.
    Later passes (a persistent-workers iterator's next epochs) are the sampler's own. Runs on
    the thread that creates the iterator, inside the iterator's first prefetch."""

    def __init__(self, skip: IndexSkip, original: Any, loader: Any) -> None:
        self.skip = skip
        self.original = original
        self.loader = loader
        self.started = False
        self.passed_over = 0  # skipped batches whose indices no worker got (the probed one included)

    def __iter__(self) -> Iterator[Any]:
        # An iterator calls ``iter`` once when built and again in its first reset; only the pass
        # it draws from counts as the first.
        return iter(self.original) if self.started else self._first_pass()

    def __len__(self) -> int:
        return len(self.original)

    def __getattr__(self, name: str) -> Any:
        if name == "original":
            raise AttributeError(name)
        return getattr(self.original, name)

    def _first_pass(self) -> Iterator[Any]:
        self.started = True
        indices = iter(self.original)
        try:
            first = next(indices)
        except StopIteration:
            return
        if not self.skip.probe(self.loader, first):
            yield first
            yield from indices
            return
        self.passed_over = 1
        for _ in range(self.skip.remaining - 1):
            try:
                next(indices)
            except StopIteration:
                return
            self.passed_over += 1
        yield from indices
