"""Keras scenarios for test_keras_adapter.py, run in a subprocess per backend and phase.

    KERAS_BACKEND=torch python tests/keras/scenario.py first  WORKDIR
    KERAS_BACKEND=torch python tests/keras/scenario.py resume WORKDIR
    AUTOCKPT_TEST_S3='{"url": ..., "storage_options": ...}' ... scenario.py s3-first|s3-resume WORKDIR
    AUTOCKPT_TEST_S3=... scenario.py mirror-first|mirror-resume WORKDIR

Each phase writes WORKDIR/<phase>.json with what it observed; the test module asserts on it.
Models are tiny (10 batches per epoch) and named explicitly, so variable paths, and with them
checkpoint keys, are the same in every process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import io
import json
import os
import signal
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.faults

import keras  # noqa: E402

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
elif keras.backend.backend() == "torch":
    import torch

    torch.set_num_threads(1)

from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

import autockpt_keras.checkpoint_file  # noqa: E402
from autockpt_core import (  # noqa: E402
    CheckpointWriteError,
    Config,
    ConfigError,
    ResumeNotExactWarning,
    read_manifest,
    storage_for,
)
from autockpt_core.persist import whole_read  # noqa: E402
from autockpt_core.persist.storage import LocalStorage, fetched  # noqa: E402
from autockpt_keras import AutoCheckpoint, export_weights, latest_checkpoint, restore  # noqa: E402
from autockpt_keras.callback import LOG_KEYS  # noqa: E402
from autockpt_keras.state import collect_state, unique_keys  # noqa: E402
from tests.faults import FailingStorage  # noqa: E402

READS: list[str] = []
"""The name of a checkpoint file each time it was opened for reading or memory-mapped."""


def count_checkpoint_reads() -> None:
    """From now on, note every read of a local checkpoint file in READS."""
    open_read, map_file = LocalStorage.open_read, whole_read.map_file

    def counted_open_read(self: LocalStorage, name: str) -> Any:
        if name.endswith(".safetensors"):
            READS.append(name)
        return open_read(self, name)

    def counted_map_file(path: Any) -> Any:
        READS.append(Path(path).name)
        return map_file(path)

    LocalStorage.open_read = counted_open_read  # type: ignore[method-assign]
    whole_read.map_file = autockpt_keras.checkpoint_file.map_file = counted_map_file


BATCH = 16
SAMPLES = 160  # 10 batches per epoch
EVERY = 3


def make_model() -> Any:
    model = keras.Sequential(
        [
            keras.Input((8,), name="x"),
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.BatchNormalization(name="bn"),  # non-trainable moving statistics
            keras.layers.Dropout(0.1, name="drop"),  # seed-generator state
            keras.layers.Dense(1, name="out"),
        ],
        name="net",
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-2, name="adam"), loss="mse", metrics=["mae"])
    return model


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 8)).astype("float32")
    return x, (x @ rng.normal(size=(8, 1))).astype("float32")


class Probe(keras.callbacks.Callback):
    """Placed after AutoCheckpoint: sees the state right after the restore, and the epochs."""

    def __init__(self, auto: AutoCheckpoint) -> None:
        super().__init__()
        self.auto = auto
        self.out: dict[str, Any] = {"epochs": [], "batch_end_steps": []}

    def on_train_begin(self, logs: Any = None) -> None:
        self.out["iterations_at_begin"] = int(self.model.optimizer.iterations.numpy())
        self.out["checkpoint_reads"], READS[:] = list(READS), []  # those of AutoCheckpoint's restore
        info = self.auto.restored
        self.out["restored"] = None if info is None else {
            "path": info.path, "step": info.step, "epoch": info.epoch, "next_epoch": info.next_epoch,
            "batches_done": info.resume.batches_done if info.resume is not None else None,
        }
        if info is not None:  # compare every model and optimizer variable with the file
            with fetched(info.path, self.auto.config.storage_options) as local:  # s3:// too
                saved = load_file(local)
            mismatched = []
            compared = 0
            for entry in collect_state(self.model, ("model", "optimizer")):
                compared += 1
                value = np.asarray(entry.variable.numpy())
                if entry.key not in saved or not np.array_equal(value, saved[entry.key].astype(value.dtype)):
                    mismatched.append(entry.key)
            self.out["restore_compared"] = compared
            self.out["restore_mismatched"] = mismatched

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.out["epochs"].append(epoch)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.out["batch_end_steps"].append(int(self.model.optimizer.iterations.numpy()))


def weights_digest(model: Any) -> str:
    """SHA-256 over every model and optimizer variable's bytes, in a fixed order."""
    digest = hashlib.sha256()
    for v in [*model.variables, *model.optimizer.variables]:
        digest.update(np.ascontiguousarray(v.numpy()).tobytes())
    return digest.hexdigest()


class WaitForPersistProcess(keras.callbacks.Callback):
    """After AutoCheckpoint: every checkpoint of the fit goes to a ready persist process."""

    def __init__(self, auto: AutoCheckpoint) -> None:
        super().__init__()
        self.auto = auto

    def on_train_begin(self, logs: Any = None) -> None:
        assert self.auto.session is not None and self.auto.session.wait_for_persist_process(60)


def train(
    dirpath: Path, epochs: int, seed: int | None = None, wait_for_persist: bool = False, **kwargs: Any
) -> dict[str, Any]:
    if seed is not None:
        keras.utils.set_random_seed(seed)
    model = make_model()
    auto = AutoCheckpoint(dirpath, every_n_steps=EVERY, keep_last=100, warmup_steps=2, verbose=False, **kwargs)
    probe = Probe(auto)
    x, y = data()
    READS.clear()
    iteration_reads: list[int] = []
    read = auto._read_iterations

    def counted_read() -> int:  # the optimizer's step read from the device (a GPU wait)
        iteration_reads.append(read())
        return iteration_reads[-1]

    auto._read_iterations = counted_read  # type: ignore[method-assign]
    callbacks: list[Any] = [auto, probe] + ([WaitForPersistProcess(auto)] if wait_for_persist else [])
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=callbacks)
    out = probe.out
    out["history"] = {k: [float(v) for v in vals] for k, vals in history.history.items()}
    out["events"] = [
        {"step": e.step, "epoch": e.epoch, "batch": e.batch, "next_epoch": e.next_epoch, "reason": e.reason,
         "nbytes": e.nbytes, "stall_s": e.stall_s}
        for e in auto.events
    ]
    out["iterations_at_end"] = int(model.optimizer.iterations.numpy())
    out["iteration_reads"] = iteration_reads
    out["planned_end"] = auto.session.policy.end_step if auto.session is not None else None
    out["hook_s"] = auto.session.estimates().hook_s if auto.session is not None else None
    out["digest"] = weights_digest(model)
    remote = "://" in str(dirpath)  # with a local dirpath, storage_options are the mirror's
    out["latest"] = latest_checkpoint(dirpath, storage_options=kwargs.get("storage_options") if remote else None)
    out["copied_from_mirror"] = auto.session.copied_from_mirror if auto.session is not None else None
    out["summary"] = auto.summary.line() if auto.summary else None
    out["persist_mode"] = auto.session.persist_mode.mode if auto.session is not None else None
    out["process_writes"] = auto.session.process_writes if auto.session is not None else None
    return out


class Batches(keras.utils.PyDataset):
    """The scenario's data as a PyDataset; ``augment``: each batch gets noise from numpy's
    global generator, as a random augmentation would."""

    def __init__(self, augment: bool) -> None:
        super().__init__()
        self.x, self.y = data()
        self.augment = augment

    def __len__(self) -> int:
        return SAMPLES // BATCH

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        rows = slice(i * BATCH, (i + 1) * BATCH)
        x = self.x[rows]
        if self.augment:
            x = x + np.random.normal(scale=0.01, size=x.shape).astype("float32")
        return x, self.y[rows]


def torch_loader(augment: bool, workers: int = 0) -> Any:
    """The scenario's data as a shuffled torch DataLoader with ``workers`` worker processes
    over a map-style dataset; ``augment``: each sample gets noise from torch's global generator."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Samples(Dataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.x, self.y = data()

        def __len__(self) -> int:
            return SAMPLES

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            x = torch.from_numpy(self.x[i])
            if augment:
                x = x + 0.01 * torch.randn(x.shape)
            return x, torch.from_numpy(self.y[i])

    torch.manual_seed(SEED)  # the shuffle draws from torch's generator on every backend
    return DataLoader(Samples(), batch_size=BATCH, shuffle=True, num_workers=workers)


INDEXED_INPUTS = ("pyds", "pyds-augment", "loader", "loader-augment", "workers", "workers-augment", "arrays")


def indexed_inputs() -> tuple[str, ...]:
    """The inputs :func:`indexed` runs on this backend: no DataLoader with workers on JAX (why:
    ``WORKERS_SKIPPED`` in test_keras_adapter.py), and arrays on torch only, where they skip by
    index (on the others they are drawn: the "mid" runs)."""
    backend = keras.backend.backend()
    return tuple(
        name for name in INDEXED_INPUTS
        if not (name.startswith("workers") and backend == "jax") and not (name == "arrays" and backend != "torch")
    )  # fmt: skip


def indexed(dirpath: Path, epochs: int, name: str) -> dict[str, Any]:
    """A shuffled input read by index (``pyds``: a PyDataset, ``loader``: a torch DataLoader,
    ``workers``: one with 2 worker processes, ``arrays``: numpy arrays; ``-augment``: its loads
    draw from a global generator), a checkpoint every 3 steps, none at the end (so 2 epochs
    leave one at step 18, mid-epoch); the resumed run skips the batches already trained."""
    keras.utils.set_random_seed(SEED)
    model = make_model()
    auto = AutoCheckpoint(dirpath, every_n_steps=EVERY, keep_last=2, warmup_steps=2, save_on_train_end=False)
    augment = name.endswith("-augment")
    inputs: dict[str, Any] = {}
    if name == "arrays":
        inputs["x"], inputs["y"] = data()
        inputs["batch_size"] = BATCH
    elif name.startswith("pyds"):
        inputs["x"] = Batches(augment)
    else:
        inputs["x"] = torch_loader(augment, workers=2 if name.startswith("workers") else 0)
    out: dict[str, Any] = {}

    class Skip(keras.callbacks.Callback):  # what the index skip did, seen at the first trained batch
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            skip = auto._exact.index_skip if auto._exact is not None else None
            if skip is not None and "skip" not in out and skip.remaining == 0:
                out["skip"] = {"served": skip.served, "loaded": skip.loaded}

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # the tf.data thread's prints too
        model.fit(**inputs, epochs=epochs, shuffle=True, verbose=0, callbacks=[auto, Skip()])
    if "skip" not in out and auto._exact is not None and auto._exact.index_skip is not None:
        skip = auto._exact.index_skip  # a DataLoader's skip ends when its iterator is created
        out["skip"] = {"served": skip.served, "loaded": skip.loaded}
    out.update({
        "digest": weights_digest(model),
        "restored_step": auto.restored.step if auto.restored is not None else None,
        "plan": dataclasses.asdict(auto._exact.skip_plan) if auto._exact is not None else None,
        "printed": [line for line in printed.getvalue().splitlines() if line.startswith("autockpt:")],
    })
    return out


def loss_scaled(dirpath: Path, epochs: int) -> dict[str, Any]:
    """A LossScaleOptimizer whose first steps overflow: it skips them, so ``iterations`` falls
    behind the batches trained; checkpoint steps must still only increase, across a resume."""
    keras.utils.set_random_seed(SEED)
    model = make_model()
    inner = keras.optimizers.Adam(1e-2, name="adam")
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.0**127, name="ls"), loss="mse")
    auto = AutoCheckpoint(dirpath, every_n_steps=EVERY, keep_last=100, warmup_steps=2, verbose=False)
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=[auto])
    return {
        "steps": [e.step for e in auto.events],
        "resumed_from": auto.restored.step if auto.restored is not None else None,
        "iterations_at_end": int(model.optimizer.iterations.numpy()),
        "manifest_steps": [r.step for r in read_manifest(storage_for(dirpath))],
    }


def files_report(dirpath: Path) -> list[dict[str, Any]]:
    """Each checkpoint of the manifest, read back with safetensors' own reader."""
    report = []
    for record in read_manifest(storage_for(dirpath)):
        path = str(dirpath / record.name)
        arrays = load_file(path)
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata()
        report.append({
            "name": record.name, "step": record.step, "reason": record.meta.get("reason"),
            "keys": sorted(arrays), "meta": meta,
            "iteration_value": int(arrays["optimizer/adam/iteration"]),
        })
    return report


def config_errors(workdir: Path) -> dict[str, Any]:
    bad = {"overhead_budget": 2.0, "every_n_steps": 0, "keep_last": 0, "schedule": "weird"}
    raised = {}
    for field, value in bad.items():
        try:
            AutoCheckpoint(workdir / "never", **{field: value})
            raised[field] = None
        except ConfigError as exc:
            raised[field] = exc.field
    try:
        AutoCheckpoint()
        raised["dirpath"] = None
    except ConfigError as exc:
        raised["dirpath"] = exc.field
    good = workdir / "autockpt.yaml"
    good.write_text("autockpt:\n  dirpath: from-yaml\n  overhead_budget: 3%\n  keep_last: 7\n")
    from_file = AutoCheckpoint.from_config(good, keep_last=5)
    badfile = workdir / "bad.toml"
    badfile.write_text("[autockpt]\ndirpath = 'x'\noverhead_budjet = 0.01\n")
    try:
        AutoCheckpoint.from_config(badfile)
        raised["file"] = None
    except ConfigError as exc:
        raised["file"] = exc.field
    return {
        "raised": raised,
        "from_file": {"dirpath": from_file.config.dirpath, "budget": from_file.config.overhead_budget,
                      "keep_last": from_file.config.keep_last},
        "unique_keys": unique_keys(["a", "b", "a", "a#2", "a"]),
    }


def storage_failure(workdir: Path) -> dict[str, Any]:
    """The 3rd checkpoint's write fails in the writer thread; fit() must raise it."""
    dirpath = workdir / "failing"
    storage = FailingStorage(dirpath)
    model = make_model()
    auto = AutoCheckpoint(dirpath, every_n_steps=2, warmup_steps=0, verbose=False, storage=storage)

    class ArmOnThird(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            storage.armed = len(auto.events) >= 2  # the next checkpoint (the 3rd) fails

    x, y = data()
    out: dict[str, Any] = {}
    try:
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[ArmOnThird(), auto])
        out["raised"] = None
    except CheckpointWriteError as exc:
        out["raised"] = type(exc).__name__
        out["cause"] = type(exc.__cause__).__name__
        out["message"] = str(exc)
    out["iterations_when_raised"] = int(model.optimizer.iterations.numpy())
    out["event_steps"] = [e.step for e in auto.events]
    out["latest"] = latest_checkpoint(dirpath)
    out["files"] = sorted(os.listdir(dirpath))
    out["failures"] = storage.failures
    return out


def outside_fit(workdir: Path) -> dict[str, Any]:
    """restore() and export_weights() on fresh models, outside fit()."""
    source = workdir / "run"
    latest = latest_checkpoint(source)
    model = make_model()
    info = restore(model, source)
    saved = load_file(latest)
    kernel_equal = bool(np.array_equal(model.get_layer("out").kernel.numpy(), saved["model/net/out/kernel"]))
    target = make_model()
    h5 = export_weights(source, workdir / "exported.weights.h5", target)
    fresh = make_model()
    fresh.load_weights(h5)
    weights_equal = all(np.array_equal(a, b) for a, b in zip(fresh.get_weights(), model.get_weights()))
    return {
        "restore_step": info.step,
        "iterations": int(model.optimizer.iterations.numpy()),
        "kernel_equal": kernel_equal,
        "export_weights_equal": weights_equal,
    }


SEED = 7


def same_training(with_callback_digest: str) -> dict[str, Any]:
    """The seeded "run" (with the callback, no failure) and the same training without it end
    with the same bits."""
    keras.utils.set_random_seed(SEED)
    model = make_model()
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    return {"equal": weights_digest(model) == with_callback_digest}


def keywords() -> dict[str, Any]:
    """Every Config field is a keyword of AutoCheckpoint, with Config's default."""
    params = inspect.signature(AutoCheckpoint).parameters
    missing, wrong_default = [], []
    for field in dataclasses.fields(Config):
        if field.name not in params:
            missing.append(field.name)
        elif field.default is not dataclasses.MISSING and params[field.name].default != field.default:
            wrong_default.append(field.name)
    return {"missing": missing, "wrong_default": wrong_default}


def preempt_and_continue(workdir: Path) -> dict[str, Any]:
    """SIGUSR1 at step 5 with on_preempt="continue": a committed checkpoint of step 6, then on.

    On TensorFlow the global seed is unset first, so shuffled arrays are not reproducible in
    a new process: the callback must say so with a ResumeNotExactWarning.
    """
    if keras.backend.backend() == "tensorflow":
        tf.random.set_seed(None)  # undo set_random_seed from an earlier scenario
    model = make_model()
    dirpath = workdir / "usr1"
    auto = AutoCheckpoint(dirpath, every_n_steps=100, warmup_steps=0, verbose=False, on_preempt="continue")

    class SignalAtStep(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if int(self.model.optimizer.iterations.numpy()) == 5:
                os.kill(os.getpid(), signal.SIGUSR1)

    x, y = data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=True, verbose=0, callbacks=[auto, SignalAtStep()])
    record = auto.preempted
    return {
        "preempted": None if record is None else {"step": record.step, "signal": record.signal},
        "events": [(e.step, e.reason, e.batches_done) for e in auto.events],
        "iterations": int(model.optimizer.iterations.numpy()),
        # The handler before fit() may be one a failed fit() left (storage_failure): ours skips
        # it, so what is back afterwards is the process's original SIG_DFL.
        "handler_restored": signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
        "manifest_steps": [r.step for r in read_manifest(storage_for(dirpath))],
        "not_exact_warnings": [str(w.message) for w in caught if issubclass(w.category, ResumeNotExactWarning)],
    }


def rng_roundtrip() -> dict[str, Any]:
    """capture() then restore() gives the same draws from every global generator again."""
    import random

    from autockpt_keras import rng

    backend = keras.backend.backend()
    keras.random.normal((2,))  # creates Keras' global SeedGenerator
    if backend == "tensorflow":
        tf.random.get_global_generator().normal([2])

    def draws() -> list[float]:
        out = [random.random(), float(np.random.rand())]
        out += [float(v) for v in keras.ops.convert_to_numpy(keras.random.normal((3,)))]
        if backend == "tensorflow":
            out += [float(v) for v in tf.random.get_global_generator().normal([2]).numpy()]
        if backend == "torch":
            out += [float(v) for v in torch.rand(2)]
        return out

    state = rng.capture(backend)
    json.dumps(state)  # plain JSON: it goes into the safetensors header
    first = draws()
    rng.restore(state, backend)
    return {"components": sorted(state), "equal": draws() == first}


def input_checks() -> dict[str, Any]:
    """What the input inspection reports for reproducible and non-reproducible pipelines."""
    from autockpt_keras.input_checks import inspect_inputs, tf_dataset_problems, torch_loader_problems

    out: dict[str, Any] = {"no_iterator": list(inspect_inputs(None, keras.backend.backend()).problems)}
    if keras.backend.backend() == "tensorflow":
        tf.random.set_seed(None)
        base = tf.data.Dataset.range(16)
        cases = {
            "seeded": base.shuffle(16, seed=1).map(lambda v: v + tf.cast(tf.random.uniform([], seed=2) > 2, tf.int64)),
            "unseeded_shuffle": base.shuffle(16),
            "unseeded_op": base.map(lambda v: v + tf.cast(tf.random.uniform([]) > 2, tf.int64)),
            "nondeterministic": base.map(lambda v: v, num_parallel_calls=2, deterministic=False),
            "generator": base.map(lambda v: v + tf.cast(tf.random.get_global_generator().uniform([]) > 2, tf.int64)),
        }
        for name, ds in cases.items():
            problems, reshuffles = tf_dataset_problems(ds.batch(4))
            out[name] = {"problems": problems, "reshuffles": reshuffles}
    elif keras.backend.backend() == "torch":
        from torch.utils.data import DataLoader, TensorDataset

        data_set = TensorDataset(torch.zeros(8, 2))
        out["global_generator"] = torch_loader_problems(DataLoader(data_set, batch_size=2, shuffle=True))
        own = DataLoader(data_set, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(0))
        out["own_generator"] = torch_loader_problems(own)
    return out


def main() -> None:
    phase, workdir = sys.argv[1], Path(sys.argv[2])
    result: dict[str, Any] = {"backend": keras.backend.backend()}
    try:
        if phase == "first":
            import autockpt_keras

            result["api"] = {
                "all": sorted(autockpt_keras.__all__),
                "public": sorted(
                    n for n in dir(autockpt_keras)
                    if not n.startswith("_") and type(getattr(autockpt_keras, n)).__name__ != "module"
                ),
            }
            result["config"] = config_errors(workdir)
            result["run"] = train(workdir / "run", epochs=2, seed=SEED, log_metrics=True)
            result["run_files"] = files_report(workdir / "run")
            result["mid"] = train(workdir / "mid", epochs=2, save_on_train_end=False)
            result["loss_scaled"] = loss_scaled(workdir / "loss-scaled", epochs=2)
            for name in indexed_inputs():
                result[f"{name}-whole"] = indexed(workdir / f"{name}-whole", epochs=4, name=name)
                result[name] = indexed(workdir / name, epochs=2, name=name)
            result["failure"] = storage_failure(workdir)
            result["keywords"] = keywords()
            result["same"] = same_training(result["run"]["digest"])
            result["usr1"] = preempt_and_continue(workdir)
            result["rng"] = rng_roundtrip()
            result["inputs"] = input_checks()
        elif phase in ("s3-first", "s3-resume"):  # tests/keras/test_keras_object_storage.py
            s3 = json.loads(os.environ["AUTOCKPT_TEST_S3"])
            epochs = 2 if phase == "s3-first" else 4
            result["run"] = train(s3["url"], epochs=epochs, seed=SEED, save_on_train_end=False,
                                  storage_options=s3["storage_options"])
            if phase == "s3-resume":
                result["local"] = train(workdir / "uninterrupted", epochs=4, seed=SEED, save_on_train_end=False)
        elif phase in ("mirror-first", "mirror-resume"):  # a node-local dirpath, the bucket as mirror
            s3 = json.loads(os.environ["AUTOCKPT_TEST_S3"])
            node = workdir / ("node-a" if phase == "mirror-first" else "node-b")  # node b: an empty disk
            epochs = 2 if phase == "mirror-first" else 4
            result["run"] = train(node, epochs=epochs, seed=SEED, save_on_train_end=False, mirror=s3["url"],
                                  storage_options=s3["storage_options"])
            if phase == "mirror-resume":
                result["local"] = train(workdir / "uninterrupted", epochs=4, seed=SEED, save_on_train_end=False)
        elif phase == "resume":
            count_checkpoint_reads()
            result["run"] = train(workdir / "run", epochs=4, wait_for_persist=True, log_metrics=True)
            result["mid"] = train(workdir / "mid", epochs=4, save_on_train_end=False)
            result["loss_scaled"] = loss_scaled(workdir / "loss-scaled", epochs=4)
            for name in indexed_inputs():
                result[name] = indexed(workdir / name, epochs=4, name=name)
            result["outside"] = outside_fit(workdir)
        else:
            raise SystemExit(f"unknown phase {phase!r}")
        result["log_keys"] = sorted(LOG_KEYS)
    except BaseException:
        result["error"] = traceback.format_exc()
    (workdir / f"{phase}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
