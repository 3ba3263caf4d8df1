"""What keeps a resume from being exact, read from ``fit()``'s input before training starts.

:func:`inspect_inputs` says, per input type and backend, what keeps a resume from being exact
(an unseeded shuffle, a nondeterministic tf.data pipeline, a DataLoader with its own
generator); the callback warns with those reasons (a
:class:`~autockpt_core.ResumeNotExactWarning`) and stores them in every
:class:`~autockpt_keras.resume_point.ResumePoint`, so the resumed run can name them too. The
:class:`InputReport` also says how the resume must treat the input (``reshuffles``,
``pipeline_thread``).

Call order and threading: :func:`inspect_inputs` once, in ``on_train_begin``, on the training
thread; it only reads the data adapter and the Python objects of a tf.data pipeline (nothing
is drawn). The private names of adapters and tf.data it reads are in
:mod:`autockpt_keras.internals`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from . import internals


#: Backends on which a resumed epoch continues at the checkpoint's batch (others replay it).
EXACT_BACKENDS = ("tensorflow", "torch", "jax")


@dataclasses.dataclass(frozen=True)
class InputReport:
    """The kind of input ``fit()`` trains on and why a resume from it may not be exact."""

    kind: str
    problems: tuple[str, ...] = ()
    reshuffles: bool = False  # a tf.data dataset whose order changes with every new iterator
    pipeline_thread: bool = False  # batches are made ahead (a background thread, or JAX's look-ahead)


def inspect_inputs(epoch_iterator: Any | None, backend: str) -> InputReport:
    """Classify ``fit()``'s input (through its data adapter) and list what is not reproducible."""
    problems: list[str] = []
    if backend not in EXACT_BACKENDS:
        problems.append(
            f"exact mid-epoch resume supports the TensorFlow, torch and JAX backends, not {backend!r}: "
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
        if backend == "tensorflow" and internals.shuffles_arrays(adapter) and not _tf_global_seed_set():
            problems.append(
                "array inputs with shuffle=True are shuffled on the TensorFlow backend by "
                "tf.random.shuffle, which is unseeded here, so a new process draws another order: "
                "call keras.utils.set_random_seed(seed) before building the model"
            )
    elif name == "TFDatasetAdapter":
        kind = "tf.data"
        found, reshuffles = tf_dataset_problems(internals.tf_dataset(adapter))
        problems.extend(found)
    elif name == "PyDatasetAdapter":
        kind = "PyDataset"
        # TensorFlow runs the Python generator in tf.data's prefetch thread; workers > 1 or
        # multiprocessing use Keras' own threads or processes.
        threaded = loads_ahead(backend) or getattr(adapter, "enqueuer", None) is not None
    elif name == "TorchDataLoaderAdapter":
        kind = "torch DataLoader"
        problems.extend(torch_loader_problems(internals.torch_dataloader(adapter)))
        # TensorFlow iterates the loader in tf.data's prefetch thread (from_generator)
        threaded = loads_ahead(backend)
    elif name == "GeneratorDataAdapter":
        kind = "generator"
        threaded = loads_ahead(backend)
    else:
        kind = name
        problems.append(f"autockpt does not know whether {name} inputs come in the same order in a new process")
    return InputReport(kind, tuple(problems), reshuffles, threaded)


def loads_ahead(backend: str) -> bool:
    """Whether ``fit()`` on ``backend`` draws a Python input's batches before the batch in
    training ends: TensorFlow (tf.data's prefetch thread), and JAX where Keras' JAX epoch
    iterator fetches one batch ahead (``_one_batch_ahead_iterator``): before Keras 3.15 always,
    from 3.15 on off the CPU only (read in Keras 3.14's and 3.15's ``backend/jax/trainer.py``).
    A load that draws from a global generator has then already drawn the next batch when a
    checkpoint captures the generator, so a resume replays the epoch's draws instead of
    skipping by index."""
    if backend == "tensorflow":
        return True
    if backend != "jax":
        return False
    return keras_release() < (3, 15) or jax_backend() != "cpu"


def keras_release() -> tuple[int, int]:
    """The installed Keras' (major, minor)."""
    from importlib.metadata import version

    major, minor = version("keras").split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def jax_backend() -> str:
    import jax

    return str(jax.default_backend())


def _tf_global_seed_set() -> bool:
    """Whether a global seed is set (True where this TensorFlow cannot say: nothing to warn about)."""
    global_seed = internals.read(internals.module("tensorflow.python.eager.context"), "tf_global_seed")
    return global_seed is None or global_seed() is not None


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
        for gone in internals.tf_dataset_missing(ds):
            problems.append(f"autockpt cannot check {kind}: this TensorFlow has no {gone.label} ({gone.needed_for})")
        if internals.read(ds, "reshuffle_each_iteration"):
            reshuffles = True
        if internals.read(ds, "deterministic") == "false":
            problems.append(f"{kind} with deterministic=False")
        for attr in internals.TF_FUNCTION_ATTRS:
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
        inputs = internals.read(ds, "dataset_inputs")
        if inputs is None:
            continue
        try:
            todo.extend(inputs())
        except Exception:  # a dataset without inputs information
            pass


def _seeds(ds: Any) -> tuple[int, int] | None:
    seed, seed2 = internals.read(ds, "dataset_seed"), internals.read(ds, "dataset_seed2")
    if seed is None or seed2 is None:
        return None
    try:
        return int(_as_int(seed)), int(_as_int(seed2))
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
