"""Keras training script for the fault harness (contract: see harness.py).

``python -m tests.fault.keras_script DIRPATH OUT [--baseline] [--backend tensorflow|torch]
[--inputs arrays|pydataset|tfdata|repeat|dataloader] [--epochs N] [--every K]
[--steps-per-epoch S] [--steps-per-execution K] [--val] [--async-persist 0|1] [--seed N]
[--strategy none|mirrored|dataparallel] [--val-sleep S] [--val-batch B] [--grace D]``

A small MLP with dropout and batch normalization, Adam with a per-step decaying learning
rate, on shuffled synthetic data: 96 samples, batch 8, so 12 steps per epoch (``--inputs
repeat`` and ``--steps-per-epoch`` change how epochs cut the data). Input types:

- ``arrays``: numpy arrays, ``fit(shuffle=True)``;
- ``pydataset``: a ``keras.utils.PyDataset`` that draws a random crop offset per batch from
  numpy's global generator in ``__getitem__`` and is shuffled by ``fit()``;
- ``tfdata``: ``tf.data`` with ``.shuffle()`` (reshuffled every epoch, seed from the global
  seed) and a random-noise ``map`` with an op seed;
- ``repeat``: the same pipeline ``.repeat()``-ed, with ``steps_per_epoch`` 10 (epochs share
  one iterator and cut through the passes);
- ``dataloader``: a torch ``DataLoader(shuffle=True)`` (any backend).

``--strategy mirrored`` (TensorFlow): the model is built and trained under a
``tf.distribute.MirroredStrategy`` over two logical CPU devices (each batch split in two);
``OUT`` then also holds each device's copy of every variable (``<path>@device<i>``).
``--strategy dataparallel`` (JAX): a ``keras.distribution.DataParallel`` over two CPU
devices of this process (``--xla_force_host_platform_device_count=2``). ``--strategy
jaxdist`` (JAX): two processes joined by ``jax.distributed`` (gloo on 127.0.0.1) under a
``DataParallel`` over both; this process is process 0 and starts process 1 (the same command,
``RANK=1``, in its process group, so a job kill takes both); each process feeds its own half of
the data (a global batch of 16, 6 steps per epoch) shuffled by its own generators (Python's
and numpy's seeded per process), process 0 writes ``OUT`` after both ended,
and the script's exit status is process 0's (or process 1's, if only that one failed).

The callback checkpoints every ``--every`` steps (dense, so faults land in every phase),
keeps 2, and resumes automatically. Faults come from ``tests.fault.child``: ``step`` is
reported in ``on_train_batch_begin`` (skipped batches of a resumed epoch report the
checkpoint's step), ``val`` in ``on_test_batch_begin`` of ``fit()``'s validation, ``snapshot`` inside the callback's snapshot, the storage phases through
``FaultStorage``. ``OUT`` gets every model and optimizer variable, by path;
``OUT.logs.json`` the epochs this process trained and their ``History`` logs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import warnings
from typing import Any


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("dirpath")
    parser.add_argument("out")
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "tensorflow"))
    parser.add_argument("--inputs", default="arrays", choices=["arrays", "pydataset", "tfdata", "repeat", "dataloader"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=None)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--val", action="store_true")
    parser.add_argument("--async-persist", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategy", default="none", choices=["none", "mirrored", "dataparallel", "jaxdist"])
    parser.add_argument("--deadline", default=None, help="the callback's deadline")
    parser.add_argument("--notice", default=None, help="the callback's preemption_notice (polled every 0.2 s)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds each training step sleeps (a long run)")
    parser.add_argument("--val-sleep", type=float, default=0.0, help="seconds each validation batch sleeps")
    parser.add_argument("--val-batch", type=int, default=None, help="validation_batch_size (32 samples)")
    parser.add_argument("--grace", default=None, help="the callback's grace_period")
    return parser.parse_args(argv)


ARGS = _parse(sys.argv[1:] if __name__ == "__main__" else [])
os.environ["KERAS_BACKEND"] = ARGS.backend
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if ARGS.strategy == "dataparallel":  # JAX: two CPU devices in this process
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

import numpy as np  # noqa: E402

PROCESS_ENV = "AUTOCKPT_TEST_JAX_PROCESS"  # "<process id>:<coordinator port>" in process 1
PEER = None  # process 0 of a jaxdist job: process 1's Popen
if ARGS.strategy == "jaxdist":
    import socket
    import subprocess

    if PROCESS_ENV in os.environ:
        PROCESS_ID, _, PORT = os.environ[PROCESS_ENV].partition(":")
    else:
        with socket.socket() as _s:
            _s.bind(("127.0.0.1", 0))
            PROCESS_ID, PORT = "0", str(_s.getsockname()[1])
        PEER = subprocess.Popen(
            [sys.executable, "-m", "tests.fault.keras_script", *sys.argv[1:]],
            env=dict(os.environ, **{PROCESS_ENV: f"1:{PORT}", "RANK": "1"}),
        )
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{PORT}", num_processes=2, process_id=int(PROCESS_ID))

if ARGS.backend == "tensorflow" or ARGS.inputs in ("tfdata", "repeat"):
    import tensorflow as tf

    if ARGS.strategy == "mirrored":  # two logical CPU devices, before TensorFlow initializes
        (_cpu,) = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
if ARGS.backend == "torch" or ARGS.inputs == "dataloader":
    import torch

    torch.set_num_threads(1)

import keras  # noqa: E402

import autockpt_keras.snapshot as snapshot_module  # noqa: E402
from autockpt_keras import AutoCheckpoint  # noqa: E402
from autockpt_keras.jax_state import local_value  # noqa: E402
from tests.fault.child import FaultPlan, FaultStorage, exit_without_teardown  # noqa: E402

PLAN = FaultPlan.from_env()
SAMPLES, BATCH, FEATURES = 96, 8, 10


def make_model(steps_per_execution: int = 1) -> Any:
    inputs = keras.Input((8,), name="x")
    h = keras.layers.Dense(32, activation="relu", name="hidden")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Dropout(0.25, name="drop")(h)
    outputs = keras.layers.Dense(1, name="out")(h)
    model = keras.Model(inputs, outputs, name="net")
    lr = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=5, decay_rate=0.9)
    model.compile(
        optimizer=keras.optimizers.Adam(lr, name="adam"),
        loss="mse",
        metrics=["mae"],
        steps_per_execution=steps_per_execution,
    )
    return model


def make_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    y = (x[:, :8].sum(axis=1, keepdims=True) + 0.1 * rng.normal(size=(SAMPLES, 1))).astype("float32")
    return x, y


class CropDataset(keras.utils.PyDataset):
    """Batches of 8 features cut at a random offset (numpy's global generator) from 10."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        super().__init__()
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x) // BATCH

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        offset = int(np.random.randint(0, FEATURES - 8 + 1))
        rows = slice(i * BATCH, (i + 1) * BATCH)
        return self.x[rows, offset : offset + 8], self.y[rows]


def fit_inputs(x: np.ndarray, y: np.ndarray) -> tuple[Any, dict[str, Any]]:
    """What ``fit()`` gets as data, and the matching keyword arguments."""
    kwargs: dict[str, Any] = {"steps_per_epoch": ARGS.steps_per_epoch}
    x8 = x[:, :8]
    if ARGS.inputs == "arrays":
        return (x8, y), {**kwargs, "batch_size": BATCH, "shuffle": True}
    if ARGS.inputs == "pydataset":
        return (CropDataset(x, y),), {**kwargs, "shuffle": True}
    if ARGS.inputs in ("tfdata", "repeat"):
        ds = tf.data.Dataset.from_tensor_slices((x8, y)).shuffle(SAMPLES)
        ds = ds.map(lambda a, b: (a + tf.random.normal(tf.shape(a), stddev=0.01, seed=5), b))
        ds = ds.batch(BATCH)
        if ARGS.inputs == "repeat":
            ds = ds.repeat()
            kwargs["steps_per_epoch"] = ARGS.steps_per_epoch or 10
        return (ds,), kwargs
    if ARGS.inputs == "dataloader":
        from torch.utils.data import DataLoader, TensorDataset

        data = TensorDataset(torch.from_numpy(x8), torch.from_numpy(y))
        return (DataLoader(data, batch_size=BATCH, shuffle=True),), kwargs
    raise ValueError(ARGS.inputs)


class StepProbe(keras.callbacks.Callback):
    """Reports the ``step`` phase before each batch's update (the fault may kill here)."""

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        iterations = self.model.optimizer.iterations
        step = local_value(iterations.value) if ARGS.strategy == "jaxdist" else iterations.numpy()
        PLAN.hit("step", step=int(step), batch=batch)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if ARGS.step_sleep:
            time.sleep(ARGS.step_sleep)  # a longer run; the weights do not change

    def on_test_batch_begin(self, batch: int, logs: Any = None) -> None:
        PLAN.hit("val", step=int(self.model.optimizer.iterations.numpy()), batch=batch)

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        if ARGS.val_sleep:
            time.sleep(ARGS.val_sleep)  # a longer validation


def _hook_snapshot() -> None:
    """Report the ``snapshot`` phase inside the callback's snapshot (after the copy)."""
    original = snapshot_module.make_snapshot

    def make_snapshot(arrays: Any, meta: Any) -> Any:
        PLAN.hit("snapshot", step=int(meta["step"]))
        return original(arrays, meta)

    snapshot_module.make_snapshot = make_snapshot  # type: ignore[assignment]


def main() -> int:
    warnings.filterwarnings("ignore", message=".*ran out of data.*")
    keras.utils.set_random_seed(ARGS.seed)
    if "torch" in sys.modules:  # set_random_seed seeds torch on the torch backend only
        sys.modules["torch"].manual_seed(ARGS.seed)
    if ARGS.strategy == "dataparallel":
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    if ARGS.strategy == "jaxdist":
        distribution = keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False)
        keras.distribution.set_distribution(distribution)
    if ARGS.strategy == "mirrored":
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            model = make_model(ARGS.steps_per_execution)
    else:
        model = make_model(ARGS.steps_per_execution)
    x, y = make_data()
    if ARGS.strategy == "jaxdist":  # each process its own half of the data, shuffled by generators of its own
        x, y = x[jax.process_index() :: 2], y[jax.process_index() :: 2]
        random.seed(ARGS.seed + 1000 * jax.process_index())  # (after the model's weights are drawn,
        np.random.seed(ARGS.seed + 1000 * jax.process_index())  # which every process draws alike)
    data, kwargs = fit_inputs(x, y)
    callbacks: list[Any] = []
    if not ARGS.baseline:
        _hook_snapshot()
        storage = FaultStorage(ARGS.dirpath, PLAN, suffix=".safetensors", half=2048)
        callbacks.append(
            AutoCheckpoint(
                ARGS.dirpath,
                every_n_steps=ARGS.every,
                keep_last=2,
                async_persist=bool(ARGS.async_persist),
                storage=storage,
                **({"deadline": ARGS.deadline} if ARGS.deadline else {}),
                **({"grace_period": ARGS.grace} if ARGS.grace else {}),
                **({"preemption_notice": ARGS.notice, "notice_poll_interval": 0.2} if ARGS.notice else {}),
            )
        )
    callbacks.append(StepProbe())
    validation = (x[:32, :8], y[:32]) if ARGS.val else None
    if ARGS.val_batch:
        kwargs["validation_batch_size"] = ARGS.val_batch
    history = model.fit(*data, epochs=ARGS.epochs, verbose=0, callbacks=callbacks, validation_data=validation, **kwargs)
    if ARGS.strategy == "jaxdist" and jax.process_index() != 0:
        return 0  # process 0 writes OUT
    logs = {"epochs": list(history.epoch), "history": {k: [float(v) for v in vals] for k, vals in history.history.items()}}
    with open(ARGS.out + ".logs.json", "w", encoding="utf-8") as f:
        json.dump(logs, f)
    weights = {v.path: keras.ops.convert_to_numpy(local_value(v.value)) for v in model.variables}
    for v in model.variables + model.metrics_variables:  # every device's copy under a strategy
        for i, component in enumerate(getattr(v.value, "values", ()) if ARGS.strategy == "mirrored" else ()):
            weights[f"{v.path}@device{i}"] = component.numpy()
    weights.update({f"optimizer/{v.path}": keras.ops.convert_to_numpy(local_value(v.value)) for v in model.optimizer.variables})
    tmp = ARGS.out + ".tmp.npz"
    np.savez(tmp, **weights)
    os.replace(tmp, ARGS.out)
    return 0


def run() -> int:
    """``main()``; in a jaxdist job both processes then pass ``jax.distributed.shutdown()`` (a
    barrier) and process 0 waits for process 1, whose failure counts as the job's."""
    try:
        code = main()
    except SystemExit as exc:  # Preempted: 128 + signal number
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        if ARGS.strategy == "jaxdist":
            jax.distributed.shutdown()
        peer = PEER.wait() if PEER is not None else 0
    if code == 0 and peer != 0:
        return 1 if peer < 0 else peer
    return code


if __name__ == "__main__":
    if ARGS.strategy == "jaxdist":
        exit_without_teardown(run())  # as the Lightning scripts with several ranks
    sys.exit(run())
