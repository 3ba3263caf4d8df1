"""Keras worker of ``autockpt compare`` and ``autockpt goodput``: one case per process.

``python -m autockpt_bench.workers.keras_study {train,restore,goodput} --spec SPEC.json``
runs one case of the contract in :mod:`autockpt_bench.study.protocol` on the spec's
``keras_backend`` (default tensorflow; set with the thread caps before Keras is imported;
TensorFlow runs with ``enable_op_determinism`` and tf.data's autotuning off: see
:func:`input_without_autotuning`). The models are :mod:`.keras_models`; one epoch
is ``make_data(workload, steps_per_epoch)`` fed as numpy arrays with ``shuffle=False``.

Methods (``train`` and ``restore``): ``none``; ``autockpt`` / ``autockpt-budget``
(:class:`~autockpt_keras.AutoCheckpoint`, keep 2, resumed by its auto-resume); ``autockpt-ab``
(train only: ``every_n_steps=every`` in the alternating blocks of
:mod:`autockpt_bench.study.in_process_ab`);
``modelcheckpoint-h5`` / ``modelcheckpoint-keras`` (``ModelCheckpoint`` to
``ckpt-e{epoch}-b{batch}.weights.h5`` / ``.keras``; resumed with build + compile + optimizer
build + ``load_weights`` / with ``load_model``, then ``fit(initial_epoch=step // steps_per_epoch)``:
the interrupted epoch is replayed from its first batch); ``backup-restore`` (``BackupAndRestore``,
which restores the weights and the epoch and replays it); ``orbax`` (``OrbaxCheckpoint(
save_on_background=True, max_to_keep=2)``; resumed with ``model.load_weights(dir)``, which
loads the newest step, then the epoch as above); ``tf-manager`` (``tf.train.Checkpoint`` over
the model and optimizer with a ``CheckpointManager(max_to_keep=2)``, saved synchronously by a
small callback; restored with ``checkpoint.restore(manager.latest_checkpoint)``; TensorFlow
backend only). A method that cannot run here (orbax not installed, tf-manager on another
backend) writes ``{"framework", "workload", "method", "skipped": why}`` and exits 0.

How each figure is taken (``train``): the step ends in a callback placed after the method's,
at ``on_train_batch_end`` (global step = ``optimizer.iterations``); the method's hooks that may
save (``on_train_batch_end``, and autockpt's ``on_epoch_begin`` where a checkpoint due at an
epoch's last batch is taken) are timed with :func:`.study_common.time_hooks`; a checkpoint is
detected by wrapping the method's save function (autockpt ``_take``, ``ModelCheckpoint`` and
``BackupAndRestore`` ``_save_model``, ``OrbaxCheckpoint._save_checkpoint``,
``CheckpointManager.save``). ``save_s``: synchronous methods, the time in that function;
autockpt, from the start of ``_take`` to the writer thread's commit callback; orbax, from
the start of ``_save_checkpoint`` to the end of ``result()`` on its save future (a thread
waits on it). After the last step the worker waits for the in-flight write (autockpt
``session.flush()``, orbax ``wait_until_finished()``) and ends through ``finish_train``.

``restore``: ``load_s`` is the time the method takes to put the state back, everything it
needs for that included (autockpt's whole ``on_train_begin``: picking and verifying the
checkpoint, building the optimizer and the metrics, assigning;
``BackupAndRestore.on_train_begin``; ``optimizer.build`` with ``load_weights`` or
``checkpoint.restore``, which need it; ``load_model``), as the Lightning worker times
autockpt's whole ``on_fit_start``; ``resumed_step`` is ``optimizer.iterations`` when
training starts;
training stops when the data position (epoch × steps_per_epoch + batch + 1) reaches ``steps``,
so a method that replays an epoch ends with ``final_step > steps``. The restoring run takes no
new checkpoints (its save frequency is set out of reach), except that autockpt still allocates
its copy buffers at the first step as it always does.

``goodput``: ``step`` in the events is the job's data position (epoch × steps_per_epoch +
batch + 1): for autockpt it is the global step; for ``BackupAndRestore`` (which replays the
epoch) it goes back to the epoch's start after a resume, while ``optimizer.iterations`` keeps
counting (the ``resumed`` event has it as ``global_step``). ``blocked_s`` is the time in the
method's save function (autockpt ``_take``: snapshot plus any wait for the previous persist).
"""

from __future__ import annotations

import time

_STARTED = time.time()  # the goodput "start" event: before Keras and TensorFlow are imported

import math
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..study.in_process_ab import Alternation
from ..study.protocol import KERAS_METHODS, EventLog, write_json
from ..study.workloads import Workload, make_data
from .hooks import wrap_call
from .keras_methods import (
    NEVER,
    h5_step,
    iterations,
    make_autockpt,
    make_probe,
    make_tf_saver,
    orbax_newest,
    skip_reason,
    tf_manager,
)
from .study_common import (
    Timeline,
    ab_result,
    finish_restore,
    finish_train,
    path_bytes,
    reported_overhead,
    serve,
    setup_threads,
    time_hooks,
)

GOODPUT_METHODS = ("none", "every-epoch", "native-every-n", "autockpt", "autockpt-budget", "autockpt-mtbf")
FORMATS = {
    "none": None,
    "autockpt": ".safetensors",
    "autockpt-budget": ".safetensors",
    "autockpt-ab": ".safetensors",
    "modelcheckpoint-h5": ".weights.h5",
    "modelcheckpoint-keras": ".keras",
    "backup-restore": "BackupAndRestore (.weights.h5)",
    "orbax": "orbax dir",
    "tf-manager": "tf checkpoint",
}


def setup_backend(spec: dict[str, Any]) -> str:
    """``KERAS_BACKEND`` and the thread caps, before Keras is imported; TF op determinism."""
    backend = spec.get("keras_backend") or "tensorflow"
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    threads = int(spec.get("threads") or 0)
    setup_threads(threads)
    if backend == "tensorflow":
        import tensorflow as tf

        if threads > 0:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.experimental.enable_op_determinism()
        input_without_autotuning()
    elif backend == "torch":
        import torch

        if threads > 0:
            torch.set_num_threads(threads)
    return backend


def input_without_autotuning() -> None:
    """The tf.data input Keras builds from the arrays, with tf.data's autotuning off (every method).

    Destroying an autotuned iterator (Keras drops each epoch's at the next epoch's first batch)
    waits for its autotuning thread, and that thread can miss the cancellation's wake-up
    (TensorFlow 2.21: ``CancellationManager`` runs the callbacks before it marks itself
    cancelled) and sleep out its optimization period, which doubles from 10 ms: a stall of up to
    ~20 s at an epoch of 20.5-41 s, with or without checkpoints. Which runs meet it depends on
    where their epoch ends against those periods, not on the method.
    """
    import tensorflow as tf
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    original = ArrayDataAdapter.get_tf_dataset

    def get_tf_dataset(self: Any) -> Any:
        options = tf.data.Options()
        options.autotune.enabled = False
        return original(self).with_options(options)

    ArrayDataAdapter.get_tf_dataset = get_tf_dataset


def weights_of(model: Any) -> list[Any]:
    import keras

    return [keras.ops.convert_to_numpy(v.value) for v in model.trainable_weights]


class Job:
    def __init__(self, workload: Workload, method: dict[str, Any], spec: dict[str, Any]) -> None:
        self.workload, self.method, self.spec = workload, method, spec
        self.name = method["name"]
        self.steps = int(spec["steps"])
        self.spe = workload.steps_per_epoch
        self.epochs = math.ceil(self.steps / self.spe)
        self.dir = Path(spec.get("dir") or ".")
        self.x, self.y = make_data(workload, self.spe)

    def fit(self, model: Any, callbacks: list[Any], initial_epoch: int = 0) -> None:
        model.fit(self.x, self.y, batch_size=self.workload.batch, shuffle=False, epochs=self.epochs,
                  initial_epoch=initial_epoch, verbose=0, callbacks=callbacks)

    def base(self) -> dict[str, Any]:
        return {"framework": "keras", "workload": self.workload.name, "method": self.name}


# -- train ------------------------------------------------------------------------------------------


def run_train(job: Job) -> None:
    import keras

    from .keras_models import build_model, state_bytes, trainable_params

    model = build_model(job.workload)
    method, name, d = job.method, job.name, job.dir
    d.mkdir(parents=True, exist_ok=True)
    timeline = Timeline()
    starts: dict[int, float] = {}  # step -> start of its save (perf_counter)
    completed: dict[int, float] = {}  # step -> its file complete (asynchronous methods)
    every = int(method.get("every") or 0)
    callbacks: list[Any] = []
    hooks: list[tuple[Any, list[str]]] = []
    wait: Callable[[], None] = lambda: None
    newest: Callable[[], Any] = lambda: None
    begin: Callable[[int], None] | None = None
    auto: Any = None

    def current() -> int:
        return iterations(model)

    def sync_save(seconds: float, args: tuple[Any, ...], out: Any) -> None:
        timeline.checkpoint(current(), seconds)

    alternation = Alternation(int(method["block"]), int(job.spec.get("warmup") or 0)) if name == "autockpt-ab" else None
    if name in ("autockpt", "autockpt-budget", "autockpt-ab"):
        auto = make_autockpt(method, d, resume=False)
        # the adapter's take(due), which the driver calls for every checkpoint
        wrap_call(auto, "_take", after=lambda s, args, out: timeline.checkpoint(args[0].step),
              before=lambda due, *a, **k: starts.__setitem__(due.step, time.perf_counter()))
        callbacks.append(auto)
        hooks.append((auto, ["on_train_batch_end", "on_epoch_begin"]))

        def begin(step: int) -> None:  # the session exists now: hear its commits
            writer = auto.session.writer
            heard = writer._on_persisted

            def persisted(record: Any, seconds: float) -> None:
                completed[int(record.step)] = time.perf_counter()
                if heard is not None:
                    heard(record, seconds)

            writer._on_persisted = persisted
            if alternation is not None:
                alternation.attach(auto.session)

        wait = lambda: auto.session.flush()

        def newest() -> Any:
            records = auto.session.records()
            return auto.session.path_of(records[-1]) if records else None

    elif name in ("modelcheckpoint-h5", "modelcheckpoint-keras"):
        suffix = ".weights.h5" if name.endswith("h5") else ".keras"
        cb = keras.callbacks.ModelCheckpoint(str(d / f"ckpt-e{{epoch:04d}}-b{{batch:05d}}{suffix}"),
                                             save_weights_only=suffix == ".weights.h5", save_freq=every)
        wrap_call(cb, "_save_model", after=sync_save)
        callbacks.append(cb)
        hooks.append((cb, ["on_train_batch_end"]))
        newest = lambda: max(d.glob(f"ckpt-*{suffix}"), default=None)  # zero-padded names
    elif name == "backup-restore":
        cb = keras.callbacks.BackupAndRestore(str(d), save_freq=every, delete_checkpoint=True)
        wrap_call(cb, "_save_model", after=sync_save)
        callbacks.append(cb)
        hooks.append((cb, ["on_train_batch_end"]))
        newest = lambda: d if any(d.iterdir()) else None  # latest.weights.h5 + training_metadata.json
    elif name == "orbax":
        cb = keras.callbacks.OrbaxCheckpoint(str(d), save_freq=every, save_on_background=True, max_to_keep=2)

        def await_save(future: Any, step: int) -> None:
            future.result()
            completed[step] = time.perf_counter()

        def orbax_saved(seconds: float, args: tuple[Any, ...], out: Any) -> None:
            step = cb._total_batches_seen  # the step it passed to _save_checkpoint
            timeline.checkpoint(step)
            if cb._async_futures:
                threading.Thread(target=await_save, args=(cb._async_futures[-1], step), daemon=True).start()

        wrap_call(cb, "_save_checkpoint", after=orbax_saved, before=lambda *a, **k: starts.__setitem__(cb._total_batches_seen, time.perf_counter()))
        callbacks.append(cb)
        hooks.append((cb, ["on_train_batch_end"]))
        wait = cb.wait_until_finished
        newest = lambda: orbax_newest(d)
    elif name == "tf-manager":
        _, manager = tf_manager(model, d)
        cb = make_tf_saver(model, manager, every)
        wrap_call(manager, "save", after=sync_save)
        callbacks.append(cb)
        hooks.append((cb, ["on_train_batch_end"]))

        def newest() -> Any:
            prefix = manager.latest_checkpoint
            return None if prefix is None else [p for p in d.iterdir() if p.name.startswith(Path(prefix).name + ".")]

    elif name != "none":
        raise ValueError(f"unknown train method {name!r}; use one of {', '.join(KERAS_METHODS)}")
    for obj, names in hooks:
        time_hooks(obj, names, timeline, current)

    warmup = int(job.spec.get("warmup") or 0)

    def on_step(step: int, position: int) -> None:
        timeline.step_done(step)
        if alternation is not None:
            alternation.step_done(step)
        if step < job.steps:
            return
        wait()  # the method's in-flight asynchronous write
        for s, t in completed.items():
            if s in starts:
                timeline.checkpoint(s, t - starts[s])
        latest = newest()
        if latest is None:
            nbytes = None
        elif isinstance(latest, list):
            nbytes = sum(path_bytes(p) for p in latest)
        else:
            nbytes = path_bytes(latest)
        result = {
            **job.base(), "params": trainable_params(model), "state_bytes": state_bytes(model), "steps": job.steps,
            "warmup": warmup, **timeline.figures(warmup), "checkpoint_bytes": nbytes, "format": FORMATS[name],
            "threads": int(job.spec.get("threads") or 0),
        }  # fmt: skip
        if auto is not None:
            result.update(reported_overhead(auto.session))
        if alternation is not None:
            result.update(ab_result(timeline, alternation))
        finish_train(job.spec, result, weights_of(model))  # ends the process

    job.fit(model, callbacks + [make_probe(model, job.spe, on_step, begin)])
    raise RuntimeError(f"fit() ended before global step {job.steps}")


# -- restore ----------------------------------------------------------------------------------------


def run_restore(job: Job) -> None:
    import keras

    from .keras_models import build_model

    name, d, spe = job.name, job.dir, job.spe
    started_at = float(job.spec["started_at"])
    state: dict[str, Any] = {"load_s": None, "restore_s": None, "resumed_step": None, "skip_s": None}
    if name.startswith("autockpt"):
        import autockpt_keras  # noqa: F401 - what autockpt adds to a restart's imports
        from autockpt_keras.skipping import SkipSteps

        def skipped(seconds: float, args: tuple[Any, ...], out: Any) -> None:
            state["skip_s"] = (state["skip_s"] or 0.0) + seconds

        for method_name in ("_draw", "_drop"):  # the batches already trained, drawn without training
            wrap_call(SkipSteps, method_name, after=skipped)
    state["imports_s"] = time.time() - started_at
    callbacks: list[Any] = []
    initial_epoch = 0

    def load(fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        out = fn()
        state["load_s"] = time.perf_counter() - start
        return out

    def record_load(seconds: float, args: tuple[Any, ...], out: Any) -> None:
        state["load_s"] = seconds

    if name in ("autockpt", "autockpt-budget"):
        model = build_model(job.workload)
        auto = make_autockpt(job.method, d, resume=True, saves=False)
        wrap_call(auto, "on_train_begin", after=record_load)
        callbacks.append(auto)
    elif name == "modelcheckpoint-h5":
        path = max(d.glob("ckpt-*.weights.h5"), default=None)
        if path is None:
            raise FileNotFoundError(f"no ckpt-*.weights.h5 in {d}")
        model = build_model(job.workload)
        # building the optimizer is part of the load, as BackupAndRestore does it: else Adam's state is skipped
        load(lambda: (model.optimizer.build(model.trainable_variables), model.load_weights(str(path))))
        initial_epoch = h5_step(path, spe) // spe
    elif name == "modelcheckpoint-keras":
        from . import keras_models  # noqa: F401 - registers the custom layer for load_model

        path = max(d.glob("ckpt-*.keras"), default=None)
        if path is None:
            raise FileNotFoundError(f"no ckpt-*.keras in {d}")
        model = load(lambda: keras.models.load_model(str(path)))
        initial_epoch = h5_step(path, spe) // spe
    elif name == "backup-restore":
        model = build_model(job.workload)
        cb = keras.callbacks.BackupAndRestore(str(d), save_freq=NEVER, delete_checkpoint=False)
        wrap_call(cb, "on_train_begin", after=record_load)
        callbacks.append(cb)
    elif name == "orbax":
        path = orbax_newest(d)
        if path is None:
            raise FileNotFoundError(f"no orbax step directory in {d}")
        model = build_model(job.workload)
        # a root directory: Keras loads its newest step
        load(lambda: (model.optimizer.build(model.trainable_variables), model.load_weights(str(d))))
        initial_epoch = int(path.name) // spe
    elif name == "tf-manager":
        model = build_model(job.workload)

        def restore_latest() -> None:
            model.optimizer.build(model.trainable_variables)
            checkpoint, manager = tf_manager(model, d)
            if manager.latest_checkpoint is None:
                raise FileNotFoundError(f"no tf checkpoint in {d}")
            checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()

        load(restore_latest)
        initial_epoch = iterations(model) // spe
    else:
        raise ValueError(f"nothing to restore with method {name!r}")

    def finish(final_step: int) -> None:
        result = {**job.base(), "restore_s": state["restore_s"], "imports_s": state["imports_s"],
                  "load_s": state["load_s"], "skip_s": state["skip_s"],
                  "resumed_step": state["resumed_step"], "final_step": final_step}
        finish_restore(job.spec, result, weights_of(model))
        sys.stdout.flush()
        os._exit(0)  # no end-of-training hook (no final checkpoint, no backup deleted)

    def on_begin(step: int) -> None:
        state["resumed_step"] = step

    def on_step(step: int, position: int) -> None:
        if state["restore_s"] is None:
            state["restore_s"] = time.time() - started_at
        if position >= job.steps:
            finish(step)

    job.fit(model, callbacks + [make_probe(model, spe, on_step, on_begin)], initial_epoch=initial_epoch)
    finish(iterations(model))  # nothing was left to train


# -- goodput ----------------------------------------------------------------------------------------


def run_goodput(job: Job, log: EventLog) -> None:
    import keras

    from .keras_models import build_model

    name, d, spe, method = job.name, job.dir, job.spe, job.method
    model = build_model(job.workload)
    callbacks: list[Any] = []
    auto: Any = None
    probe: Any = None

    def checkpoint_event(step: Callable[[tuple[Any, ...]], int]) -> Callable[[float, tuple[Any, ...], Any], None]:
        return lambda seconds, args, out: log.write("checkpoint", step=step(args), blocked_s=seconds)

    if name in ("every-epoch", "native-every-n"):
        save_freq = "epoch" if name == "every-epoch" else int(method["every"])
        cb = keras.callbacks.BackupAndRestore(str(d), save_freq=save_freq)
        wrap_call(cb, "_save_model", after=checkpoint_event(lambda args: probe.position()))
        callbacks.append(cb)
    elif name in ("autockpt", "autockpt-budget", "autockpt-mtbf"):
        auto = make_autockpt({**method, "name": "autockpt" if name == "autockpt" else "autockpt-budget"}, d, resume=True)
        wrap_call(auto, "_take", after=checkpoint_event(lambda args: args[0].step))
        callbacks.append(auto)
    elif name != "none":
        raise ValueError(f"unknown goodput method {name!r}; use one of {', '.join(GOODPUT_METHODS)}")

    def on_begin(step: int) -> None:
        if auto is not None:
            position = auto.restored.step if auto.restored is not None else 0
        else:
            position = (model._initial_epoch or 0) * spe  # BackupAndRestore sets it (the epoch to replay)
        log.write("resumed", step=position, global_step=step)

    finish_fit = bool(job.spec.get("finish_fit"))  # examples/process_fixed_costs.py: fit() ends as a user's does

    def on_step(step: int, position: int) -> None:
        log.write("step", step=position)
        if position >= job.steps and not finish_fit:
            persist_s = auto.session.estimates().persist_s if auto is not None else None
            log.write("done", step=position, persist_s=persist_s)
            os._exit(0)

    probe = make_probe(model, spe, on_step, on_begin)
    job.fit(model, callbacks + [probe])
    if not finish_fit:
        raise RuntimeError(f"fit() ended before the job's step {job.steps}")
    log.write("done", step=job.steps, persist_s=None)  # after the end-of-training hooks


# -- entry point ------------------------------------------------------------------------------------


def run_case(case: str, workload: Workload, method: dict[str, Any], spec: dict[str, Any], log: EventLog | None) -> None:
    backend = setup_backend(spec)
    reason = skip_reason(method["name"], backend)
    if reason is not None:
        if log is not None:
            raise SystemExit(f"keras_study goodput: {reason}")
        write_json(spec["out"], {"framework": "keras", "workload": workload.name, "method": method["name"], "skipped": reason})
        return
    job = Job(workload, method, spec)
    if log is not None:
        run_goodput(job, log)
    elif case == "train":
        run_train(job)
    else:
        run_restore(job)


def main(argv: list[str] | None = None) -> int:
    return serve(argv, "python -m autockpt_bench.workers.keras_study", _STARTED, run_case)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
