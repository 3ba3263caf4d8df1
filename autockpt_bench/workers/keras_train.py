"""The ``train`` case of the Keras study worker: one method trains ``steps`` steps, timed.

How each figure is taken: the step ends in a callback placed after the method's, at
``on_train_batch_end`` (global step = ``optimizer.iterations``); the method's hooks that may
save (``on_train_batch_end``, and autockpt's ``on_epoch_begin`` where a checkpoint due at an
epoch's last batch is taken) are timed with :func:`.study_common.time_hooks`; a checkpoint is
detected by wrapping the method's save function (autockpt ``_take``, ``ModelCheckpoint`` and
``BackupAndRestore`` ``_save_model``, ``OrbaxCheckpoint._save_checkpoint``,
``CheckpointManager.save``). ``save_s``: synchronous methods, the time in that function;
autockpt, from the start of ``_take`` to the writer thread's commit callback; orbax, from
the start of ``_save_checkpoint`` to the end of ``result()`` on its save future (a thread
waits on it). After the last step the worker waits for the in-flight write (autockpt
``session.flush()``, orbax ``wait_until_finished()``) and ends through ``finish_train``.

Called by :func:`.keras_study.run_case` in the worker process (training thread); the process
ends in ``finish_train``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..study.in_process_ab import Alternation
from ..study.protocol import KERAS_METHODS
from .hooks import wrap_call
from .keras_job import Job, weights_of
from .keras_methods import iterations, make_autockpt, make_probe, make_tf_saver, orbax_newest, tf_manager
from .study_common import Timeline, ab_result, finish_train, path_bytes, reported_overhead, time_hooks

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
