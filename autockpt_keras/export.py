"""Using checkpoints outside ``fit()``: load them into a model, or leave autockpt's format.

``restore(model, source)`` loads the full training state (weights, optimizer, metrics) into a
built model, e.g. for evaluation or a custom loop. ``export_weights(source, filepath, model)``
loads only the model's variables and writes a regular Keras ``.weights.h5`` file, which
``model.load_weights`` reads without autockpt.

``source`` is a checkpoint directory (its newest valid checkpoint is used) or the path of one
``.safetensors`` checkpoint file. Both functions run on the calling thread and must not run
while ``fit()`` is training the same model.

``autockpt export`` (:mod:`autockpt_bench.export`) reads a checkpoint it picked and verified
itself, then uses :func:`load_into` (``.weights.h5``, ``.keras``) or :func:`model_arrays`
(``.safetensors``, no model needed).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from .checkpoint_file import CheckpointInfo, load_checkpoint
from .state import GROUPS, REPLICA, assign_state, collect_state, ensure_built


def restore(
    model: Any,
    source: str | os.PathLike[str],
    *,
    include_optimizer: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> CheckpointInfo:
    """Load a checkpoint's state into ``model`` and return what the checkpoint says about itself.

    The model must be built (``keras.Input`` or ``model.build``); a compiled model's optimizer
    is built here if needed, so its slots can be assigned. With ``include_optimizer=False`` (or
    an uncompiled model) only the model's variables are loaded. Raises
    :class:`~autockpt_keras.state.StateMismatchError` (nothing assigned) if the checkpoint
    belongs to another architecture, ``FileNotFoundError`` if ``source`` has no checkpoint.
    ``storage_options``: fsspec options for a URL ``source`` (as the callback's).
    """
    arrays, info = load_checkpoint(source, storage_options)
    load_into(model, arrays, info, include_optimizer=include_optimizer)
    return info


def load_into(
    model: Any, arrays: Mapping[str, np.ndarray], info: CheckpointInfo, *, include_optimizer: bool = True
) -> None:
    """:func:`restore` for a checkpoint already read (``read_checkpoint_bytes``, ``read_record``)."""
    has_optimizer = getattr(model, "optimizer", None) is not None
    groups = GROUPS if include_optimizer and has_optimizer else ("model",)
    ensure_built(model)  # builds a compiled model's optimizer; raises with the fix if unbuilt
    assign_state(collect_state(model, groups), arrays, order=info.keys, groups=groups)


def model_arrays(arrays: Mapping[str, np.ndarray], info: CheckpointInfo) -> dict[str, np.ndarray]:
    """The checkpoint's ``model`` group, keyed by each variable's Keras path (``variable.path``,
    e.g. ``"sequential/dense/kernel"``: the key without ``model/``), in the checkpoint's order.

    Trainable and non-trainable variables (BatchNorm statistics, random layers' seed states);
    the per-device copies a ``tf.distribute`` run also stores (``@replica<i>``) are left out.
    """
    prefix = "model/"
    return {
        key[len(prefix):]: arrays[key]
        for key in info.keys
        if key.startswith(prefix) and REPLICA not in key and key in arrays
    }


def export_weights(source: str | os.PathLike[str], filepath: str | os.PathLike[str] | None, model: Any) -> str | None:
    """Write the checkpoint's model weights as a Keras ``.weights.h5`` file (or just load them).

    Loads the ``model`` group (trainable and non-trainable variables) of the checkpoint into
    ``model`` (same architecture, built), then calls ``model.save_weights(filepath)``; with
    ``filepath=None`` it only loads. Returns ``filepath``. Keras requires the name to end in
    ``.weights.h5``.
    """
    restore(model, source, include_optimizer=False)
    if filepath is None:
        return None
    path = os.fspath(filepath)
    model.save_weights(path)
    return path
