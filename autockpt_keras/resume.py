"""Exact mid-epoch resume for ``fit()``: where the data stood, and how a new process gets there.

``fit()`` cannot start an epoch at batch b, so a resumed epoch runs from batch 0 and the
callback makes its first b batches *skips*: :class:`SkipSteps` stands in for
``model.train_function`` and, for those calls, only draws the batch from the data (as the
interrupted run did) without training on it. Drawing instead of jumping keeps everything the
data pipeline does per batch (its RNG draws, a ``PyDataset``'s ``__getitem__``, tf.data's
random ops) in step with the uninterrupted run; it costs the data loading of those batches.

For the skipped batches to be the same batches, the resumed epoch's data must come in the
same order. Keras draws that order when the epoch's iterator is created, from a global
generator (array inputs: torch's on the torch backend; ``PyDataset``: Python's ``random``;
torch ``DataLoader``: torch's) or from an op-seeded ``tf.random.shuffle`` (array inputs on
TensorFlow: the same order in every process once a global seed is set). So the generators
are captured when each *stream* (one data iterator) starts and restored at the same point of
the resumed run, before that iterator is created. A stream is one epoch unless
``steps_per_epoch`` makes epochs share one iterator (a repeated dataset, or
``steps_per_epoch`` smaller than the data); :class:`DataStream` follows that, so the position
is "stream k, batch p" and the skip also covers batches of earlier epochs of the same stream.

A tf.data dataset that reshuffles on every iteration (``.shuffle()`` default) gives its k-th
iterator in a process the k-th order; a new process starts again at the first. Resuming in a
stream whose iterator was the k-th therefore first creates and drops k iterators
(:func:`advance_dataset`).

:func:`inspect_inputs` says, per input type and backend, what keeps a resume from being exact
(an unseeded shuffle, a nondeterministic tf.data pipeline, a DataLoader with its own
generator); the callback warns with those reasons.

Keras internals used (checked against Keras 3.15's TensorFlow and torch trainers): the local
``epoch_iterator`` of ``fit()`` (:func:`find_epoch_iterator`), its ``_get_iterator``,
``_current_iterator`` and ``_steps_seen``, and ``model.train_function``, which ``fit()`` looks
up at every batch. Without the epoch iterator, every epoch is assumed to start a new stream.

Everything here runs on the training thread, inside ``fit()``'s hooks and its
``train_function`` calls.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import types
import weakref
from typing import Any, Callable, Iterable

log = logging.getLogger("autockpt")

#: Version of the JSON written under the ``resume`` key of the checkpoint header.
POINT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a checkpoint sits in the training timeline, and the generators at that moment.

    ``epoch``: the epoch ``fit()`` resumes at; ``batches_done``: batches of it already trained
    (the resumed epoch skips them; 0 = the epoch starts fresh). ``iterators_before``:
    tf.data iterators created before the current stream's (see :class:`DataStream`);
    ``stream_pos``: batches drawn from the current stream. ``rng_stream``: the global
    generators when the current iterator was created; ``rng_first_draw``: when its first batch
    was drawn, if other code ran in between (an iterator Keras created right after the
    previous epoch's last batch and first drew from after validation), else None;
    ``rng_step``: at the checkpoint. ``problems``: why a resume from here may not be exact
    (empty: exact).
    """

    epoch: int
    batches_done: int
    iterators_before: int
    stream_pos: int
    rng_stream: dict[str, Any]
    rng_step: dict[str, Any]
    rng_first_draw: dict[str, Any] | None = None
    steps_per_execution: int = 1
    inputs: str = "unknown"
    problems: tuple[str, ...] = ()

    @property
    def drop(self) -> int:
        """Batches of the stream drawn before this epoch (same stream, earlier epochs)."""
        return max(0, self.stream_pos - self.batches_done)

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["problems"] = list(self.problems)
        data["version"] = POINT_VERSION
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "ResumePoint":
        data = json.loads(text)
        version = data.pop("version", None)
        if version != POINT_VERSION:
            raise ValueError(f"unsupported resume point version {version!r}")
        data["problems"] = tuple(data.get("problems", ()))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# -- fit()'s epoch iterator ------------------------------------------------------------------------


def find_epoch_iterator(max_depth: int = 40) -> Any | None:
    """The ``EpochIterator`` of the ``fit()`` call that is running the current callback hook.

    Keras does not hand it to callbacks; its trainers (TensorFlow, torch, JAX) keep it in the
    local ``epoch_iterator`` of ``fit``. This reads that frame's locals (read only), and
    returns None if the frame is not found (another trainer, a future Keras), in which case
    the callback assumes that every epoch starts a new iterator.
    """
    frame: types.FrameType | None = sys._getframe(1)
    depth = 0
    while frame is not None and depth < max_depth:
        if frame.f_code.co_name == "fit":
            candidate = frame.f_locals.get("epoch_iterator")
            if _looks_like_epoch_iterator(candidate):
                return candidate
        frame = frame.f_back
        depth += 1
    return None


def _looks_like_epoch_iterator(obj: Any) -> bool:
    return obj is not None and all(
        hasattr(obj, name) for name in ("data_adapter", "steps_per_epoch", "_steps_seen", "_current_iterator")
    )


@dataclasses.dataclass(frozen=True)
class StreamState:
    """Where the data stream stands (see :class:`ResumePoint` for the fields)."""

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
    the duration of ``fit()`` (:meth:`close` unwraps it).

    ``index`` is what a resumed run must replay to get the same order from a reshuffling
    tf.data input: the number of tf.data iterators created before the current stream's. On
    the TensorFlow backend every Keras iterator is one; on the torch backend a tf.data
    iterator is created only when a stream is first drawn from.

    Call order (training thread): ``epoch_begin`` in ``on_epoch_begin`` (``resume`` instead
    for the resumed epoch), ``batch_end`` in every ``on_train_batch_end`` (skipped batches
    included), ``close`` in ``on_train_end``.
    """

    def __init__(self, epoch_iterator: Any | None, capture: Callable[[], dict[str, Any]], backend: str) -> None:
        self._ei = epoch_iterator
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
        self._tracked: Any = None
        self._pending_rng: dict[str, Any] | None = None
        self._epoch_batches = 0
        self._tf_dataset = _tf_dataset(epoch_iterator)
        if epoch_iterator is not None:
            self._hook(epoch_iterator)

    def _hook(self, ei: Any) -> None:
        original = ei._get_iterator

        def counting_get_iterator() -> Any:
            self.created += 1
            if self._by_creation:
                _count_tf_iterator(self._tf_dataset)
            after, self._after_next_creation = self._after_next_creation, None
            source = original()
            return source if after is None else _AfterIter(source, after)

        ei._get_iterator = counting_get_iterator

    def close(self) -> None:
        """Unwrap the epoch iterator (end of ``fit()``)."""
        ei = self._ei
        if ei is not None and "_get_iterator" in vars(ei):
            del ei._get_iterator

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

    def resume(self, point: ResumePoint, after_creation: Callable[[], None] | None = None) -> None:
        """The resumed epoch re-creates the checkpoint's stream (its iterator is built lazily);
        ``after_creation`` runs right after that iterator is created, before its first draw."""
        self.created = self.drawn = self.index = point.iterators_before
        self.rng = point.rng_stream
        self.rng_first = point.rng_first_draw
        self._after_next_creation = after_creation
        self._undrawn = self._fresh = True
        self._tracked = None
        self._pending_rng = None
        self._epoch_batches = 0

    def batch_end(self) -> None:
        """After a batch: the stream exists; capture the generators if Keras is about to
        replace an exhausted iterator (that happens right after this batch's callbacks)."""
        if self._undrawn:
            self._undrawn = False
            self.drawn += 1
            self.index = self.created - 1 if self._by_creation else self.drawn - 1
            if not self._by_creation:  # torch: a tf.data input's iterator is made at the first draw
                _count_tf_iterator(self._tf_dataset)
        self._fresh = False
        self._epoch_batches += 1
        ei = self._ei
        if ei is None:
            return
        self._tracked = ei._current_iterator
        num = getattr(ei, "_num_batches", None)
        if ei.steps_per_epoch and num and ei._steps_seen >= num:
            self._pending_rng = self._capture()

    def current(self) -> StreamState:
        """The stream the next batch comes from: index, batches drawn, generators at its start."""
        if self._undrawn:
            return StreamState(self._upcoming_index(created=not self._fresh), 0, self._rng(), self.rng_first)
        pos = self._epoch_batches if self._ei is None else int(self._ei._steps_seen)
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
        if ei is None or ei.steps_per_epoch is None or ei._current_iterator is None:
            return True
        return self._recreated()

    def _recreated(self) -> bool:
        ei = self._ei
        return (
            ei is not None
            and ei.steps_per_epoch is not None
            and ei._current_iterator is not None
            and self._tracked is not None
            and ei._current_iterator is not self._tracked
        )


# -- skipping the resumed epoch's first batches ----------------------------------------------------


class SkipSteps:
    """Stands in for ``model.train_function`` while the resumed epoch's first batches are skipped.

    ``fit()`` looks ``model.train_function`` up at every batch, so replacing it is enough.
    The callback sets :attr:`skipping` in ``on_train_batch_begin``. A skipped call draws the
    call's batches and returns the current metric results (:func:`current_logs`): on TensorFlow the call gets the
    iterator and draws ``steps_per_execution`` batches itself; on torch ``fit()`` already
    drew the batch. Before its first call, ``drop`` batches of the stream (earlier epochs of
    a shared stream) are drawn and dropped. The first call that is not skipped puts the
    original function back, runs ``before_first_step`` and then the original.
    """

    def __init__(
        self,
        model: Any,
        *,
        drop: int = 0,
        epoch_iterator: Any | None = None,
        before_first_step: Callable[[], None] | None = None,
    ) -> None:
        self.model = model
        self.original = model.train_function
        self.skipping = False
        self.drop = int(drop)
        self.epoch_iterator = epoch_iterator
        self.before_first_step = before_first_step
        self.skipped = 0
        self.dropped = 0
        self._metrics_built = False

    def install(self) -> None:
        self.model.train_function = self

    def uninstall(self) -> None:
        if self.model.train_function is self:
            self.model.train_function = self.original

    def __call__(self, data: Any) -> Any:
        if self.drop:
            data = self._drop(data)
        if self.skipping:
            self._draw(data)
            self.skipped += 1
            return current_logs(self.model)
        self.uninstall()
        if self.before_first_step is not None:
            callback, self.before_first_step = self.before_first_step, None
            callback()
        return self.original(data)

    def _draw(self, data: Any) -> None:
        if isinstance(data, (list, tuple)):  # torch (and JAX): fit() already drew the batch
            return
        for i in range(_steps_per_execution(self.model)):
            try:
                batch = next(data)
            except StopIteration:
                if i == 0:
                    raise
                return
            if i == 0 and not self._metrics_built:
                self._metrics_built = build_metrics(self.model, None, batch)

    def _drop(self, data: Any) -> Any:
        n, self.drop = self.drop, 0
        ei = self.epoch_iterator
        if isinstance(data, (list, tuple)):
            # torch: fit() drew the stream's first batch already; draw n more, keep the last.
            iterator = getattr(ei, "_current_iterator", None) if ei is not None else None
            if iterator is None:
                raise RuntimeError("autockpt: cannot reach fit()'s data iterator to skip batches of earlier epochs")
            batch = None
            for _ in range(n):
                batch = next(iterator)
            data = [batch]
        else:
            for _ in range(n):
                next(data)
        if ei is not None:
            ei._steps_seen += n  # Keras' own count of the stream, as in the interrupted run
        self.dropped += n
        return data


def build_metrics(model: Any, epoch_iterator: Any | None, batch: Any = None) -> bool:
    """Build the compiled metrics and losses of a TensorFlow model before its first step.

    Without a distribution strategy, Keras' TensorFlow trainer builds them when the train
    step is first traced, but a resumed epoch needs them before: their checkpoint values are
    assigned in ``on_train_begin``, and an epoch that only skips ends with
    ``model.get_metrics_result()``. Builds from ``batch`` or the input's ``element_spec``
    (symbolically: no data is drawn, no generator advances). Returns True when built.
    """
    compiled = [getattr(model, "_compile_metrics", None), getattr(model, "_compile_loss", None)]
    if all(m is None or m.built for m in compiled):
        return True
    if batch is None:
        batch = getattr(getattr(epoch_iterator, "_distributed_dataset", None), "element_spec", None)
    if batch is None:
        return False
    try:
        model._symbolic_build(data_batch=batch)
    except Exception as exc:  # not fatal: the metrics are built by the first real step instead
        log.info("autockpt: could not build the compiled metrics early: %s", exc)
        return False
    return True


def current_logs(model: Any) -> dict[str, Any]:
    """The results of the model's metrics that exist (compiled metrics are built by the first
    real step on TensorFlow), as a skipped step's logs."""
    logs: dict[str, Any] = {}
    for metric in model.metrics:
        try:
            result = metric.result()
        except ValueError:  # not built yet
            continue
        if isinstance(result, dict):
            logs.update(result)
        else:
            logs[metric.name] = result
    return logs


def unwrap_train_function(model: Any) -> None:
    """Put the original ``train_function`` back if a :class:`SkipSteps` was left installed
    (a ``fit()`` that raised during the skip)."""
    fn = getattr(model, "train_function", None)
    while isinstance(fn, SkipSteps):
        fn = fn.original
        model.train_function = fn


def _steps_per_execution(model: Any) -> int:
    return int(getattr(model, "steps_per_execution", 1) or 1)


# tf.data iterators this process created per dataset object (counted by DataStream and
# advance_dataset), so a second fit() on the same object in one process does not advance it twice.
_TF_ITERATORS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _tf_dataset(epoch_iterator: Any | None) -> Any | None:
    if epoch_iterator is None or type(epoch_iterator.data_adapter).__name__ != "TFDatasetAdapter":
        return None
    return getattr(epoch_iterator.data_adapter, "_dataset", None)


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


# -- what keeps a resume from being exact ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class InputReport:
    """The kind of input ``fit()`` trains on and why a resume from it may not be exact."""

    kind: str
    problems: tuple[str, ...] = ()
    reshuffles: bool = False  # a tf.data dataset whose order changes with every new iterator
    pipeline_thread: bool = False  # batches are made ahead in a background thread


def inspect_inputs(epoch_iterator: Any | None, backend: str) -> InputReport:
    """Classify ``fit()``'s input (through its data adapter) and list what is not reproducible."""
    problems: list[str] = []
    if backend not in ("tensorflow", "torch"):
        problems.append(
            f"exact mid-epoch resume supports the TensorFlow and torch backends, not {backend!r}: "
            "an interrupted epoch is replayed from its first batch"
        )
    if epoch_iterator is None:
        problems.append(
            "autockpt could not find fit()'s data iterator (another trainer or Keras version); it "
            "assumes every epoch starts a new pass over the data"
        )
        return InputReport("unknown", tuple(problems))
    adapter = epoch_iterator.data_adapter
    name = type(adapter).__name__
    reshuffles = False
    threaded = False
    if name == "ArrayDataAdapter":
        kind = "arrays"
        if getattr(adapter, "_shuffle", False) and backend == "tensorflow" and not _tf_global_seed_set():
            problems.append(
                "array inputs with shuffle=True are shuffled on the TensorFlow backend by "
                "tf.random.shuffle, which is unseeded here, so a new process draws another order: "
                "call keras.utils.set_random_seed(seed) before building the model"
            )
    elif name == "TFDatasetAdapter":
        kind = "tf.data"
        found, reshuffles = tf_dataset_problems(getattr(adapter, "_dataset", None))
        problems.extend(found)
    elif name == "PyDatasetAdapter":
        kind = "PyDataset"
        # TensorFlow runs the Python generator in tf.data's prefetch thread; workers > 1 or
        # multiprocessing use Keras' own threads or processes.
        threaded = backend == "tensorflow" or getattr(adapter, "enqueuer", None) is not None
    elif name == "TorchDataLoaderAdapter":
        kind = "torch DataLoader"
        problems.extend(torch_loader_problems(getattr(adapter, "_dataloader", None)))
    elif name == "GeneratorDataAdapter":
        kind = "generator"
        threaded = backend == "tensorflow"
    else:
        kind = name
        problems.append(f"autockpt does not know whether {name} inputs come in the same order in a new process")
    return InputReport(kind, tuple(problems), reshuffles, threaded)


def _tf_global_seed_set() -> bool:
    try:
        from tensorflow.python.eager import context
    except ImportError:  # pragma: no cover
        return False
    return context.global_seed() is not None


_FUNCTION_ATTRS = ("_map_func", "_predicate", "_func", "_key_func", "_reduce_func", "_finalize_func",
                   "_init_func", "_scan_func", "_window_size_func")
_GENERATOR_OPS = {"StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt", "StatefulStandardNormalV2",
                  "StatefulTruncatedNormal", "RngReadAndSkip", "RngSkip", "StatefulRandomBinomial"}
_SEEDED_OPS = {"TruncatedNormal", "Multinomial", "ParameterizedTruncatedNormal"}


def tf_dataset_problems(dataset: Any) -> tuple[list[str], bool]:
    """(problems, reshuffles) of a tf.data pipeline, from its Python dataset objects.

    Problems: a shuffle or random dataset without a seed (no op seed and no global seed), an
    unseeded stateful random op or a ``tf.random.Generator`` inside a function (``map``,
    ``filter``...), a parallel transformation or options with ``deterministic=False``.
    ``reshuffles``: some shuffle draws a new order for every iterator.
    """
    if dataset is None:
        return [], False
    problems: list[str] = []
    reshuffles = False
    try:
        options = dataset.options()
        if options.deterministic is False:
            problems.append("tf.data options set deterministic=False (elements may come in another order)")
    except Exception:  # options() on an odd dataset: nothing to report
        pass
    for ds in _walk_datasets(dataset):
        kind = type(ds).__name__.lstrip("_")
        seeds = _seeds(ds)
        if seeds is not None and seeds == (0, 0):
            problems.append(f"an unseeded {kind} (pass seed= or call keras.utils.set_random_seed before building it)")
        if getattr(ds, "_reshuffle_each_iteration", False):
            reshuffles = True
        if getattr(ds, "_deterministic", None) == "false":
            problems.append(f"{kind} with deterministic=False")
        for attr in _FUNCTION_ATTRS:
            wrapper = getattr(ds, attr, None)
            graph = getattr(getattr(wrapper, "function", None), "graph", None)
            if graph is None:
                continue
            for op in graph.get_operations():
                problem = _op_problem(op, kind)
                if problem and problem not in problems:
                    problems.append(problem)
    return problems, reshuffles


def _walk_datasets(dataset: Any) -> Iterable[Any]:
    seen: set[int] = set()
    todo = [dataset]
    while todo:
        ds = todo.pop()
        if id(ds) in seen:
            continue
        seen.add(id(ds))
        yield ds
        try:
            todo.extend(ds._inputs())
        except Exception:  # a dataset without inputs information
            pass


def _seeds(ds: Any) -> tuple[int, int] | None:
    if not (hasattr(ds, "_seed") and hasattr(ds, "_seed2")):
        return None
    try:
        return int(_as_int(ds._seed)), int(_as_int(ds._seed2))
    except (TypeError, ValueError):
        return None


def _as_int(value: Any) -> int:
    numpy = getattr(value, "numpy", None)
    return int(numpy() if callable(numpy) else value)


def _op_problem(op: Any, where: str) -> str | None:
    kind = op.type
    if kind in _GENERATOR_OPS:
        return f"a tf.random.Generator drawn inside {where} (its draws run ahead with prefetching)"
    if kind.startswith("Random") or kind in _SEEDED_OPS:
        try:
            seed, seed2 = op.get_attr("seed"), op.get_attr("seed2")
        except (ValueError, AttributeError):
            return None
        if seed == 0 and seed2 == 0:
            return f"an unseeded {kind} op inside {where} (pass seed= or set a global seed)"
    return None


def torch_loader_problems(loader: Any) -> list[str]:
    """A torch DataLoader (or its sampler) with a generator of its own: that generator restarts
    in a new process, so a resumed epoch gets another order."""
    if loader is None:
        return []
    owners = [("DataLoader", loader), ("sampler", getattr(loader, "sampler", None))]
    batch_sampler = getattr(loader, "batch_sampler", None)
    owners.append(("batch sampler's sampler", getattr(batch_sampler, "sampler", None)))
    for what, obj in owners:
        if obj is not None and getattr(obj, "generator", None) is not None:
            return [
                f"the torch {what} has its own generator=, which is not saved and restarts in a new "
                "process: leave generator=None (the global torch generator is restored) or reseed it "
                "per epoch"
            ]
    return []
