"""The ``restore`` case of the Keras study worker: a method puts its newest checkpoint back and
trains to ``steps``.

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

Called by :func:`.keras_study.run_case` in the worker process (training thread); the process
ends with ``os._exit(0)`` after ``finish_restore``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .hooks import wrap_call
from .keras_job import Job, weights_of
from .keras_methods import NEVER, h5_step, iterations, make_autockpt, make_probe, orbax_newest, tf_manager
from .study_common import finish_restore


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
