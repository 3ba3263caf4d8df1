"""Skipping the batches a resumed epoch already trained: draw them, do not train on them.

``fit()`` cannot start an epoch at batch b, so a resumed epoch runs from batch 0 and the
callback makes its first b batches *skips*: :class:`SkipSteps` stands in for
``model.train_function`` and, for those calls, only draws the batch from the data (as the
interrupted run did) without training on it. Drawing instead of jumping keeps everything the
data pipeline does per batch (its RNG draws, a ``PyDataset``'s ``__getitem__``, tf.data's
random ops) in step with the uninterrupted run; it costs the data loading of those batches.
Which batches are the same batches is :mod:`autockpt_keras.data_stream`'s part.

Keras internals used (through :mod:`autockpt_keras.internals`): ``model.train_function``, which
``fit()`` looks up at every batch (swapped through the callback's patch stack), the epoch
iterator's ``_current_iterator`` and ``_steps_seen``, and for :func:`build_metrics`
``model._symbolic_build`` or, for a functional model, what it calls (``Functional.output``,
``model.compute_metrics``, ``model._compute_loss``, ``compute_output_spec``).

Call order: :func:`unwrap_train_function` first in ``on_train_begin`` (a skip left installed
by a failed ``fit()``); :func:`build_metrics` when the checkpoint is restored; a
:class:`SkipSteps` installed in the resumed epoch's ``on_epoch_begin``, switched per batch in
``on_train_batch_begin``, and uninstalled by its first real step or in ``on_train_end``.
Everything here runs on the training thread, inside ``fit()``'s hooks and its
``train_function`` calls.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from autockpt_core.internals_door import Patch, PatchStack

from . import internals

log = logging.getLogger("autockpt")


class SkipSteps:
    """Stands in for ``model.train_function`` while the resumed epoch's first batches are skipped.

    ``fit()`` looks ``model.train_function`` up at every batch, so replacing it is enough.
    The callback sets :attr:`skipping` in ``on_train_batch_begin``. A skipped call draws the
    call's batches and returns the current metric results (:func:`current_logs`): on TensorFlow
    and JAX the call gets the iterator and draws ``steps_per_execution`` batches itself (on
    JAX it also gets and returns the training state, unchanged); on torch ``fit()`` already
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
        patches: PatchStack | None = None,
    ) -> None:
        self.model = model
        self._patches = patches if patches is not None else PatchStack()
        self._patch: Patch | None = None
        self.original = model.train_function
        self.skipping = False
        self.drop = int(drop)
        self.epoch_iterator = epoch_iterator
        self.before_first_step = before_first_step
        self.skipped = 0
        self.dropped = 0
        self._metrics_built = False

    def install(self) -> None:
        self._patch = self._patches.set(self.model, "train_function", self)

    def uninstall(self) -> None:
        self._patches.undo(self._patch)
        self._patch = None

    def __call__(self, *args: Any) -> Any:
        # TensorFlow and torch call train_function(data); JAX calls train_function(state,
        # iterator) and takes back (logs, state): a skipped call returns the state unchanged
        state, data = args if len(args) == 2 else (None, args[0])
        if self.drop:
            data = self._drop(data)
        if self.skipping:
            self._draw(data)
            self.skipped += 1
            if len(args) == 2:
                return jax_logs(self.model, state), state
            return current_logs(self.model)
        self.uninstall()
        if self.before_first_step is not None:
            callback, self.before_first_step = self.before_first_step, None
            callback()
        return self.original(*args[:-1], data)

    def _draw(self, data: Any) -> None:
        if isinstance(data, (list, tuple)):  # torch: fit() already drew the batch (TF and JAX pass the iterator)
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
            iterator = internals.current_iterator(ei)
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
            internals.add_steps_seen(ei, n)  # Keras' own count of the stream, as in the interrupted run
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
    if all(m.built for m in internals.compiled_metrics_and_loss(model)):
        return True
    if batch is None:
        batch = internals.element_spec(epoch_iterator)
    symbolic_build = internals.read(model, "symbolic_build")
    if batch is None or symbolic_build is None:
        return False
    try:
        if not _build_from_outputs(model, batch):
            symbolic_build(data_batch=batch)
    except Exception as exc:  # not fatal: the metrics are built by the first real step instead
        log.info("autockpt: could not build the compiled metrics early: %s", exc)
        return False
    return True


def _build_from_outputs(model: Any, batch: Any) -> bool:
    """What Keras' ``_symbolic_build`` does for the compiled metrics and loss, from a built
    functional model's symbolic output instead of a symbolic pass through every layer again
    (0.09-0.11 s of a restart for the study's 40-layer MLP, 0.01 s this way). False, having
    built nothing, for a subclassed model or one with a layer not built yet."""
    import keras

    functional = internals.read(internals.module("keras.src.models.functional"), "functional_class")
    output_spec = internals.read(internals.module("keras.src.backend"), "compute_output_spec")
    if functional is None or output_spec is None:
        return False
    graph = internals.read(model, "functional") if not isinstance(model, functional) else model
    layers, compute_loss = internals.read(model, "flatten_layers"), internals.read(model, "compute_loss")
    if not isinstance(graph, functional) or layers is None or compute_loss is None:
        return False
    if not all(layer.built for layer in layers()):
        return False

    def symbolic(value: Any) -> Any:
        if value is None:
            return None
        return keras.KerasTensor(value.shape, keras.backend.standardize_dtype(value.dtype))

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(keras.tree.map_structure(symbolic, batch))
    y_pred = graph.output
    metrics, loss = internals.read(model, "compile_metrics"), internals.read(model, "compile_loss")
    if metrics is not None and not metrics.built:
        output_spec(model.compute_metrics, x, y, y_pred, sample_weight=sample_weight)
    if loss is not None and not loss.built:
        output_spec(compute_loss, x, y, y_pred, sample_weight=sample_weight, training=False)
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


def jax_logs(model: Any, state: Any) -> dict[str, Any]:
    """:func:`current_logs` on JAX, inside ``fit()``: the metric variables are detached from
    the model then (``fit()`` keeps their values in ``state``, its 4th part), so the results
    are computed from ``state``'s values."""
    scope = internals.read(internals.module("keras.src.backend.common.stateless_scope"), "stateless_scope")
    metric_values = state[3] if isinstance(state, (list, tuple)) and len(state) == 4 else None
    if scope is None:  # the metric variables are detached: nothing to read them with
        return {}
    if not metric_values:
        return current_logs(model)
    with scope(state_mapping=list(zip(model.metrics_variables, metric_values))):
        return current_logs(model)


def unwrap_train_function(model: Any) -> None:
    """Put the original ``train_function`` back if a :class:`SkipSteps` was left installed
    (a ``fit()`` that raised during the skip)."""
    fn = getattr(model, "train_function", None)
    while isinstance(fn, SkipSteps):
        fn = fn.original
        model.train_function = fn


def _steps_per_execution(model: Any) -> int:
    return int(getattr(model, "steps_per_execution", 1) or 1)
