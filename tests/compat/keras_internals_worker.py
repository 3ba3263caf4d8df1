"""Keras' private names, read on real fits, for test_keras_internals.py (one process per backend).

    KERAS_BACKEND=tensorflow python tests/compat/keras_internals_worker.py canaries OUT.json
    KERAS_BACKEND=tensorflow python tests/compat/keras_internals_worker.py renamed OUT.json KEY,KEY,...

``canaries``: every name of ``autockpt_keras.internals.INTERNALS`` that this backend uses, read
under the table's name where the adapter reads it (fit()'s hooks, a torch DataLoader's iterator,
tf.data's datasets), with the shape the adapter expects: ``{key: [ok, detail]}``.

``renamed``: for each key, the table's name changed (what a release that renamed it looks like
to the adapter), then a fit that stops mid-epoch (its final checkpoint at step 5) and a rerun
that resumes there: ``{key: {"error", "told", "steps", "resumed"}}``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import keras  # noqa: E402

from autockpt_core import ResumeNotExactWarning  # noqa: E402
from autockpt_keras import AutoCheckpoint, internals  # noqa: E402

BACKEND = keras.backend.backend()
SAMPLES, BATCH = 64, 8  # 8 steps per epoch

# the input each key is exercised with (keys not listed: arrays)
INPUT_OF = {
    "tf_dataset": "tf.data",
    "dataset_inputs": "tf.data",
    "reshuffle_each_iteration": "tf.data",
    "dataset_seed": "tf.data",
    "dataset_seed2": "tf.data",
    "map_func": "tf.data",
    "deterministic": "tf.data",
    "torch_dataloader": "torch DataLoader",
    "next_index": "torch DataLoader",
    "num_yielded": "torch DataLoader",
    "auto_collation": "torch DataLoader",
    "dataset_kind": "torch DataLoader",
}


def make_model() -> Any:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="hidden"), keras.layers.Dense(1, name="out")])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    return model


def arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def _scaled(a: Any, b: Any) -> Any:
    return a * 1.0, b


def _same(a: Any, b: Any) -> Any:
    return a, b


def _plus_one(v: Any) -> Any:
    return v + 1


def inputs(kind: str) -> dict[str, Any]:
    x, y = arrays()
    if kind == "tf.data":
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=1)
        ds = ds.map(_scaled).map(_same, num_parallel_calls=2, deterministic=True)
        return {"x": ds.batch(BATCH)}
    if kind == "torch DataLoader":
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        gen = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
        return {"x": DataLoader(data, batch_size=BATCH, shuffle=True, generator=gen)}
    return {"x": x, "y": y, "batch_size": BATCH, "shuffle": True}


# -- canaries ------------------------------------------------------------------------------------


def _callable(v: Any) -> bool:
    return callable(v)


class Reader(keras.callbacks.Callback):
    """At the first batch's end: each key's value, read under the table's name."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, Any] = {}

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.seen:
            return
        model = getattr(self, "_model", None) or self.model  # on JAX, .model reattaches the state
        ei = internals.find_epoch_iterator()
        self.seen["epoch_iterator"] = ei
        keys = ["get_iterator", "current_iterator", "steps_seen", "num_batches"]
        keys += ["distributed_dataset"] if BACKEND == "tensorflow" else []
        for key in keys:
            self.seen[key] = raw(ei, key)
        adapter = ei.data_adapter
        for key in ("tf_dataset", "torch_dataloader", "array_shuffle"):
            if internals.INTERNALS[key].owner == type(adapter).__name__:
                self.seen[key] = raw(adapter, key)
        model_keys = ["initial_epoch", "compile_metrics", "compile_loss", "symbolic_build", "compute_loss"]
        model_keys += ["flatten_layers", "functional"]
        model_keys += ["distribute_strategy"] if BACKEND == "tensorflow" else []
        model_keys += ["jax_state", "jax_state_synced"] if BACKEND == "jax" else []
        for key in model_keys:
            self.seen[key] = raw(model, key)


_ABSENT = "<absent>"


def raw(obj: Any, key: str) -> Any:
    return getattr(obj, internals.INTERNALS[key].attr, _ABSENT)


SHAPES: dict[str, Callable[[Any], bool]] = {
    "epoch_iterator": lambda v: v is not None,
    "get_iterator": _callable,
    "current_iterator": lambda v: v is not None and v is not _ABSENT,
    "steps_seen": lambda v: v == 1,
    "num_batches": lambda v: v == SAMPLES // BATCH,
    "distributed_dataset": lambda v: getattr(v, "element_spec", None) is not None,
    "tf_dataset": lambda v: type(v).__name__.lstrip("_").endswith("Dataset"),
    "torch_dataloader": lambda v: type(v).__name__ == "DataLoader",
    "array_shuffle": lambda v: v is True,
    "initial_epoch": lambda v: v is None or isinstance(v, int),
    "compile_metrics": lambda v: hasattr(v, "built"),
    "compile_loss": lambda v: hasattr(v, "built"),
    "symbolic_build": _callable,
    "compute_loss": _callable,
    "flatten_layers": lambda v: callable(v) and len(list(v())) >= 2,
    "functional": lambda v: type(v).__name__ == "Functional",
    "distribute_strategy": lambda v: v is not _ABSENT,
    "jax_state": lambda v: isinstance(v, dict) and "optimizer_variables" in v,
    "jax_state_synced": lambda v: v is False,
}


def module_canaries() -> dict[str, Any]:
    """The names held by modules, torch's loader and tf.data's datasets."""
    found: dict[str, Any] = {}
    state = internals.module("keras.src.backend.common.global_state")
    found["global_state"] = callable(raw(state, "global_state"))
    seeds = internals.module("keras.src.random.seed_generator")
    make = raw(seeds, "seed_generator")
    found["seed_generator"] = callable(make) and type(make()).__name__ == "SeedGenerator"
    functional = raw(internals.module("keras.src.models.functional"), "functional_class")
    found["functional_class"] = isinstance(functional, type) and issubclass(functional, keras.Model)
    found["compute_output_spec"] = callable(raw(internals.module("keras.src.backend"), "compute_output_spec"))
    scope = internals.module("keras.src.backend.common.stateless_scope")
    found["stateless_scope"] = isinstance(raw(scope, "stateless_scope"), type)
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2)
    iterator = iter(loader)
    found["next_index"] = callable(raw(iterator, "next_index"))
    found["num_yielded"] = raw(iterator, "num_yielded") == 0
    found["auto_collation"] = raw(loader, "auto_collation") is True
    kind = raw(internals.module("torch.utils.data.dataloader"), "dataset_kind")
    found["dataset_kind"] = callable(getattr(kind, "create_fetcher", None)) and hasattr(kind, "Map")
    found["loader_fetcher"] = internals.loader_fetcher(loader) is not None
    if BACKEND == "tensorflow":
        import tensorflow as tf

        generators = internals.module("tensorflow.python.ops.stateful_random_ops")
        found["tf_global_generator"] = raw(generators, "tf_global_generator") is not _ABSENT
        found["tf_global_seed"] = callable(raw(internals.module("tensorflow.python.eager.context"), "tf_global_seed"))
        found["eager_numpy"] = isinstance(raw(tf.constant([1.0]), "eager_numpy")(), np.ndarray)
        ds = tf.data.Dataset.range(8).shuffle(8, seed=3)
        mapped = ds.map(_plus_one)
        parallel = ds.map(_plus_one, num_parallel_calls=2, deterministic=False)
        found["dataset_inputs"] = callable(raw(mapped, "dataset_inputs")) and len(raw(mapped, "dataset_inputs")()) == 1
        found["reshuffle_each_iteration"] = raw(ds, "reshuffle_each_iteration") is True
        found["dataset_seed"] = np.asarray(raw(ds, "dataset_seed")).shape == ()  # the op seed, mixed with the global one
        found["dataset_seed2"] = np.asarray(raw(ds, "dataset_seed2")).shape == ()
        found["map_func"] = getattr(getattr(raw(mapped, "map_func"), "function", None), "graph", None) is not None
        found["deterministic"] = raw(parallel, "deterministic") == "false"
        kinds = {key for keys in internals.TF_DATA.values() for key in keys}
        names = {type(d).__name__.lstrip("_") for d in (ds, mapped, parallel)}
        found["tf_data_kinds"] = set(internals.TF_DATA) <= names and len(kinds) == 5
    return found


def canaries(out: Path) -> None:
    result: dict[str, Any] = {}
    for kind in ("arrays", "tf.data", "torch DataLoader") if BACKEND == "tensorflow" else ("arrays",):
        reader = Reader()
        make_model().fit(epochs=1, verbose=0, callbacks=[reader], **inputs(kind))
        for key, value in reader.seen.items():
            ok = SHAPES[key](value) and result.get(key, [True])[0]
            result[key] = [ok, f"{kind}: {type(value).__name__}"]
    for key, ok in module_canaries().items():
        result[key] = [bool(ok), "module, torch or tf.data"]
    out.write_text(json.dumps(result, indent=1))


# -- renamed --------------------------------------------------------------------------------------


class StopAt(keras.callbacks.Callback):
    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch = batch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if batch == self.batch:
            self.model.stop_training = True


def one_key(key: str, root: Path) -> dict[str, Any]:
    original = internals.INTERNALS[key]
    internals.INTERNALS[key] = dataclasses.replace(original, attr=original.attr + "_renamed")
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("autockpt").addHandler(handler)
    report: dict[str, Any] = {"error": None, "steps": [], "resumed": None}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kind = INPUT_OF.get(key, "arrays")
            first = AutoCheckpoint(dirpath=str(root / key), every_n_steps=3, verbose=False)
            model = make_model()
            model.fit(epochs=1, verbose=0, callbacks=[first, StopAt(4)], **inputs(kind))
            report["steps"].append(int(model.optimizer.iterations.numpy()))
            second = AutoCheckpoint(dirpath=str(root / key), every_n_steps=3, verbose=False)
            model = make_model()
            model.fit(epochs=2, verbose=0, callbacks=[second], **inputs(kind))
            report["steps"].append(int(model.optimizer.iterations.numpy()))
            report["resumed"] = second.restored.step if second.restored is not None else None
    except Exception as error:  # noqa: BLE001 - reported: the test says which kinds are allowed
        report["error"] = f"{type(error).__name__}: {error}"
        report["where"] = traceback.format_exc()[-1500:]
    finally:
        internals.INTERNALS[key] = original
        logging.getLogger("autockpt").removeHandler(handler)
    told = [str(w.message) for w in caught if issubclass(w.category, ResumeNotExactWarning)]
    report["told"] = told + records
    report["label"] = original.label
    return report


def renamed(out: Path, keys: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out.write_text(json.dumps({key: one_key(key, Path(tmp)) for key in keys}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    mode, path = sys.argv[1], Path(sys.argv[2])
    if mode == "canaries":
        canaries(path)
    else:
        renamed(path, sys.argv[3].split(","))
