"""Every private Keras, TensorFlow and torch name the Keras adapter touches, behind one door.

Exact resume in Keras needs what ``fit()`` keeps to itself: its epoch iterator (a local of
``fit``) and that iterator's counters, the data adapters' inputs, the model's start epoch and
compiled metrics, the JAX trainer's detached state, Keras' global seed generator, and, to skip
a torch ``DataLoader``'s batches by index, a few of torch's loader internals (:data:`INTERNALS`).
The adapter reads them only here (:func:`read`, :func:`has` and the functions below), so a
release that renames or removes one gives the caller None, never an ``AttributeError`` in the
middle of a save or a resume. :func:`check_internals` runs in ``on_train_begin``: a missing
name the callback cannot work without is an :class:`~autockpt_core.AutockptError` naming it
before anything trains; any other is one :class:`~autockpt_core.ResumeNotExactWarning` (or a
log warning where only speed or a check is at stake) naming it, and the callers degrade (every
epoch a new pass over the data, batches drawn instead of skipped by index, metrics built by
the first real step). tf.data's per-op attributes (:data:`TF_DATA`) exist only on some
datasets; the input checks report one that a dataset of its kind lacks.

What a fit swaps on Keras' objects (the epoch iterator's ``_get_iterator``, the stand-in
``train_function`` of a skip, ``_initial_epoch``) goes through the callback's one
:class:`~autockpt_core.internals_door.PatchStack`.

Checked against Keras 3.10 on TensorFlow 2.19 (the oldest supported releases) and Keras 3.15
on TensorFlow 2.21, torch 2.13 and JAX 0.10. The canaries in
``tests/compat/test_keras_internals.py`` check every name on the installed releases
(``python -m pytest tests/compat``).

Threading: lookups on the training thread (inside ``fit()``'s hooks and data iterators).
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

from autockpt_core.internals_door import MISSING, Internal, absent, lookup, report_missing

_TRAINS = "where a resumed epoch continues the data: which pass over the data a batch belongs to"
_METRICS = "the compiled metrics' values restored before a resumed epoch's first step (TensorFlow)"
_JAX_STEP = "reading the step while fit() holds the state, without reattaching it at every batch (JAX)"
_BY_INDEX = "skipping a torch DataLoader's trained batches by index (without it they are drawn)"

INTERNALS: dict[str, Internal] = {
    # fit()'s epoch iterator: a local of Keras' fit() (TensorFlow, torch and JAX trainers)
    "epoch_iterator": Internal("fit()", "epoch_iterator", _TRAINS),
    "get_iterator": Internal("EpochIterator", "_get_iterator", _TRAINS),
    "current_iterator": Internal("EpochIterator", "_current_iterator", _TRAINS),
    "steps_seen": Internal("EpochIterator", "_steps_seen", _TRAINS),
    "num_batches": Internal(
        "EpochIterator", "_num_batches", "the generators where an input that later epochs continue runs out"
    ),
    "distributed_dataset": Internal("TFEpochIterator", "_distributed_dataset", _METRICS, exactness=False),
    # the data adapters' inputs
    "tf_dataset": Internal("TFDatasetAdapter", "_dataset", "checking a tf.data input and replaying its reshuffles"),
    "torch_dataloader": Internal(
        "TorchDataLoaderAdapter", "_dataloader", "checking a torch DataLoader input and skipping it by index"
    ),
    "array_shuffle": Internal(
        "ArrayDataAdapter", "_shuffle", "the warning about shuffled arrays without a seed on TensorFlow"
    ),
    # the model
    "initial_epoch": Internal("Model", "_initial_epoch", "starting fit() at the checkpoint's epoch", required=True),
    "compile_metrics": Internal("Model", "_compile_metrics", _METRICS, exactness=False),
    "compile_loss": Internal("Model", "_compile_loss", _METRICS, exactness=False),
    "symbolic_build": Internal("Model", "_symbolic_build", _METRICS, exactness=False),
    "compute_loss": Internal("Model", "_compute_loss", _METRICS, exactness=False),
    "flatten_layers": Internal("Model", "_flatten_layers", _METRICS, exactness=False),
    "functional": Internal(
        "Sequential", "_functional", "building the compiled metrics fast at a restart", exactness=False
    ),
    "functional_class": Internal(
        "keras.src.models.functional", "Functional", "building the compiled metrics fast at a restart", exactness=False
    ),
    "compute_output_spec": Internal(
        "keras.src.backend", "compute_output_spec", "building the compiled metrics fast at a restart", exactness=False
    ),
    "distribute_strategy": Internal(
        "Model", "_distribute_strategy", "refusing a tf.distribute strategy autockpt cannot checkpoint", exactness=False
    ),
    "jax_state": Internal("JAXTrainer", "_jax_state", _JAX_STEP, exactness=False),
    "jax_state_synced": Internal("JAXTrainer", "_jax_state_synced", _JAX_STEP, exactness=False),
    # Keras' global generator, and the scope a skipped JAX step's logs are computed in
    "global_state": Internal(
        "keras.src.backend.common.global_state", "get_global_attribute", "Keras' global SeedGenerator"
    ),
    "seed_generator": Internal(
        "keras.src.random.seed_generator", "global_seed_generator", "Keras' global SeedGenerator"
    ),
    "stateless_scope": Internal(
        "keras.src.backend.common.stateless_scope", "StatelessScope", "a skipped JAX step's metric logs (empty without it)",
        exactness=False,
    ),
    # torch's DataLoader, for a skip by index
    "next_index": Internal("torch _BaseDataLoaderIter", "_next_index", _BY_INDEX, exactness=False),
    "num_yielded": Internal("torch _BaseDataLoaderIter", "_num_yielded", _BY_INDEX, exactness=False),
    "auto_collation": Internal("torch DataLoader", "_auto_collation", _BY_INDEX, exactness=False),
    "dataset_kind": Internal("torch.utils.data.dataloader", "_DatasetKind", _BY_INDEX, exactness=False),
    # TensorFlow
    "tf_global_generator": Internal(
        "tensorflow stateful_random_ops", "global_generator", "TensorFlow's global tf.random.Generator"
    ),
    "tf_global_seed": Internal(
        "tensorflow.python.eager.context", "global_seed", "the warning about shuffled arrays without a seed",
        exactness=False,
    ),
    "eager_numpy": Internal(
        "tensorflow EagerTensor", "_numpy", "copying a CPU tensor into the snapshot without a second copy",
        exactness=False,
    ),
    "dataset_inputs": Internal("tf.data.Dataset", "_inputs", "checking a tf.data input's datasets for randomness"),
}

# tf.data attributes that exist only on datasets of one kind: the class names (``type(ds).__name__``
# without leading underscores) that must have them
TF_DATA: dict[str, tuple[str, ...]] = {
    "ShuffleDataset": ("reshuffle_each_iteration", "dataset_seed", "dataset_seed2"),
    "MapDataset": ("map_func",),
    "ParallelMapDataset": ("map_func", "deterministic"),
}
INTERNALS |= {
    "reshuffle_each_iteration": Internal(
        "tf.data ShuffleDataset", "_reshuffle_each_iteration", "replaying a tf.data input's reshuffles"
    ),
    "dataset_seed": Internal("tf.data ShuffleDataset", "_seed", "checking that a tf.data shuffle is seeded"),
    "dataset_seed2": Internal("tf.data ShuffleDataset", "_seed2", "checking that a tf.data shuffle is seeded"),
    "map_func": Internal("tf.data MapDataset", "_map_func", "checking a tf.data map for unseeded random ops"),
    "deterministic": Internal(
        "tf.data ParallelMapDataset", "_deterministic", "checking a tf.data map for deterministic=False"
    ),
}

# the traced functions of tf.data's dataset kinds, each on its own kind (``_map_func`` has a canary)
TF_FUNCTION_ATTRS = ("_map_func", "_predicate", "_func", "_key_func", "_reduce_func", "_finalize_func",
                     "_init_func", "_scan_func", "_window_size_func")


def read(obj: Any, key: str) -> Any | None:
    """``obj``'s attribute for ``INTERNALS[key]``; None where it has no such name."""
    value = lookup(INTERNALS, obj, key)
    return None if value is MISSING else value


def has(obj: Any, key: str) -> bool:
    return lookup(INTERNALS, obj, key) is not MISSING


def attr(key: str) -> str:
    """The attribute's name, for a hot path that reads it with ``getattr`` itself."""
    return INTERNALS[key].attr


def module(name: str) -> types.ModuleType | None:
    """An imported private module (``keras.src...``, ``tensorflow.python...``), None if it is gone."""
    try:
        __import__(name)
    except ImportError:
        return None
    return sys.modules[name]


# -- fit()'s epoch iterator -------------------------------------------------------------------------


def find_epoch_iterator(max_depth: int = 40) -> Any | None:
    """The ``EpochIterator`` of the ``fit()`` call that is running the current callback hook.

    Keras does not hand it to callbacks; its trainers keep it in the local ``epoch_iterator``
    of ``fit``. This reads that frame's locals (read only); None if the frame is not found.
    """
    frame: types.FrameType | None = sys._getframe(1)
    name = attr("epoch_iterator")
    for _ in range(max_depth):
        if frame is None:
            break
        if frame.f_code.co_name == "fit":
            candidate = frame.f_locals.get(name)
            if hasattr(candidate, "data_adapter") and hasattr(candidate, "steps_per_epoch"):
                return candidate
        frame = frame.f_back
    return None


STREAM_KEYS = ("get_iterator", "current_iterator", "steps_seen")
"""What :class:`~autockpt_keras.data_stream.DataStream` follows a stream by; without any of them
it assumes every epoch starts a new pass over the data, as without the epoch iterator."""


def follows_streams(epoch_iterator: Any | None) -> bool:
    return epoch_iterator is not None and all(has(epoch_iterator, key) for key in STREAM_KEYS)


def current_iterator(epoch_iterator: Any | None) -> Any | None:
    return None if epoch_iterator is None else read(epoch_iterator, "current_iterator")


def steps_seen(epoch_iterator: Any) -> int | None:
    value = read(epoch_iterator, "steps_seen")
    return None if value is None else int(value)


def add_steps_seen(epoch_iterator: Any, n: int) -> None:
    """Keras' own count of the stream, moved on by ``n`` batches drawn past it."""
    seen = steps_seen(epoch_iterator)
    if seen is not None:
        setattr(epoch_iterator, attr("steps_seen"), seen + n)


def num_batches(epoch_iterator: Any) -> int | None:
    return read(epoch_iterator, "num_batches") or None


def element_spec(epoch_iterator: Any | None) -> Any | None:
    """The TensorFlow input's ``element_spec`` (None on another backend, or missing)."""
    return getattr(read(epoch_iterator, "distributed_dataset"), "element_spec", None)


# -- the data adapters' inputs -----------------------------------------------------------------------


def tf_dataset(adapter: Any) -> Any | None:
    return read(adapter, "tf_dataset")


def torch_dataloader(adapter: Any) -> Any | None:
    return read(adapter, "torch_dataloader")


def shuffles_arrays(adapter: Any) -> bool:
    return bool(read(adapter, "array_shuffle"))


# -- the model ----------------------------------------------------------------------------------------


def initial_epoch_key() -> str:
    """``Model._initial_epoch``'s name: ``fit()`` reads it right after ``on_train_begin`` (the
    callback sets it through its patch stack; required, so present)."""
    return attr("initial_epoch")


def compiled_metrics_and_loss(model: Any) -> list[Any]:
    """The compiled metrics and loss containers that exist (None entries dropped)."""
    return [c for c in (read(model, "compile_metrics"), read(model, "compile_loss")) if c is not None]


def model_strategy(model: Any) -> Any | None:
    return read(model, "distribute_strategy")


def jax_state(model: Any) -> Any | None:
    """``fit()``'s detached JAX state while it holds it; None when the variables hold it, and
    :data:`~autockpt_core.internals_door.MISSING` where this Keras cannot say."""
    synced = read(model, "jax_state_synced")
    if synced is None:
        return MISSING
    if synced:
        return None
    state = lookup(INTERNALS, model, "jax_state")
    return state if state is MISSING or state else None


# -- torch's DataLoader ----------------------------------------------------------------------------


def loader_fetcher(loader: Any) -> Any | None:
    """The loader's own fetcher of a map-style dataset (as its workers make it), or None."""
    dataloader = module("torch.utils.data.dataloader")
    kind = read(dataloader, "dataset_kind")
    collation = read(loader, "auto_collation")
    if kind is None or collation is None:
        return None
    return kind.create_fetcher(kind.Map, loader.dataset, collation, loader.collate_fn, loader.drop_last)


# -- at on_train_begin -------------------------------------------------------------------------------


def missing(model: Any, epoch_iterator: Any | None, backend: str) -> list[Internal]:
    """The internals this fit's releases lack, of those it would use."""
    holders: list[tuple[Any, tuple[str, ...]]] = [(model, ("initial_epoch",))]
    if epoch_iterator is None:  # not found under its name in fit()'s frame
        holders.append((None, ("epoch_iterator",)))
    else:
        holders.append((epoch_iterator, STREAM_KEYS + ("num_batches",)))
        adapter = epoch_iterator.data_adapter
        name = type(adapter).__name__
        inputs = {"TFDatasetAdapter": "tf_dataset", "TorchDataLoaderAdapter": "torch_dataloader"}
        if name in inputs:
            holders.append((adapter, (inputs[name],)))
        if name == "TFDatasetAdapter" and tf_dataset(adapter) is not None:
            holders.append((tf_dataset(adapter), ("dataset_inputs",)))
        if name == "TorchDataLoaderAdapter":
            import torch.utils.data.dataloader as dataloader

            holders.append((dataloader, ("dataset_kind",)))
            holders.append((dataloader.DataLoader, ("auto_collation",)))
            holders.append((dataloader._BaseDataLoaderIter, ("next_index",)))
        if name == "ArrayDataAdapter" and backend == "tensorflow":
            holders.append((adapter, ("array_shuffle",)))
            holders.append((module("tensorflow.python.eager.context"), ("tf_global_seed",)))
    holders.append((module("keras.src.backend.common.global_state"), ("global_state",)))
    holders.append((module("keras.src.random.seed_generator"), ("seed_generator",)))
    if backend == "tensorflow":
        holders.append((model, ("compile_metrics", "compile_loss", "symbolic_build", "compute_loss", "flatten_layers")))
        holders.append((model, ("distribute_strategy",)))
        if type(model).__name__ == "Sequential":
            holders.append((model, ("functional",)))
        holders.append((module("keras.src.models.functional"), ("functional_class",)))
        holders.append((module("keras.src.backend"), ("compute_output_spec",)))
        holders.append((module("tensorflow.python.ops.stateful_random_ops"), ("tf_global_generator",)))
        holders.append((getattr(module("tensorflow.python.framework.ops"), "EagerTensor", None), ("eager_numpy",)))
        if epoch_iterator is not None:
            holders.append((epoch_iterator, ("distributed_dataset",)))
    if backend == "jax":
        holders.append((model, ("jax_state_synced",)))
        holders.append((_NamesIn(type(model).fit), ("jax_state",)))  # an attribute from the first step on
        holders.append((module("keras.src.backend.common.stateless_scope"), ("stateless_scope",)))
    return absent(INTERNALS, holders)


class _NamesIn:
    """The attribute names a function's code uses, as attributes (for a name a fit sets later)."""

    def __init__(self, function: Any) -> None:
        code = getattr(inspect.unwrap(function), "__code__", None)
        self._names = frozenset(code.co_names) if code is not None else frozenset()

    def __getattr__(self, name: str) -> bool:
        if name in self._names:
            return True
        raise AttributeError(name)


def check_internals(model: Any, epoch_iterator: Any | None, backend: str) -> None:
    """In ``on_train_begin``: refuse a release without a required internal, naming it; say what
    is off without any other (one warning)."""
    import keras

    report_missing(missing(model, epoch_iterator, backend), f"Keras {keras.__version__} ({backend})", stacklevel=4)


def tf_dataset_missing(ds: Any) -> list[Internal]:
    """The per-kind tf.data attributes a dataset of a kind in :data:`TF_DATA` lacks."""
    keys = TF_DATA.get(type(ds).__name__.lstrip("_"), ())
    return absent(INTERNALS, [(ds, keys)])
