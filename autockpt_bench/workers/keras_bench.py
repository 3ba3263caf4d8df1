"""Keras worker of ``autockpt bench``: one configuration per process (see :mod:`.measure`).

``python -m autockpt_bench.workers.keras_bench train --method M --bytes N --dir D [--every K] [--checkpoints C]``
    fits a square MLP with Adam whose training state is ~N bytes for ``(C + 1)·K - 1`` steps with a
    checkpoint every K steps (M: ``none``, ``autockpt``, ``autockpt-thread`` (persist_mode
    "thread"), ``modelcheckpoint`` = Keras'
    ``ModelCheckpoint(save_weights_only=True)`` writing ``.weights.h5``: weights only, no
    optimizer state, no fsync) and reports the stall per checkpoint (time in the method's
    ``on_train_batch_end``), persist time, file size, mean step time after warm-up and peak
    resident memory. The backend is ``KERAS_BACKEND`` (the bench sets it; default tensorflow).
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import time
from typing import Any

from .measure import emit, mlp_layout, overlap_figures, record_persist_windows, stall_figures, step_times

METHODS = ("none", "autockpt", "autockpt-thread", "modelcheckpoint")
BATCH = 16


def train(method: str, state_bytes: int, directory: str, every: int, checkpoints: int) -> dict[str, Any]:
    import keras
    import numpy as np

    from autockpt_keras import AutoCheckpoint

    width, layers = mlp_layout(state_bytes)
    total_steps = checkpoints * every + every - 1  # C windows of `every` steps after warm-up, one checkpoint each
    warm = every - 1
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(width,))
    hidden = inputs
    for i in range(layers):
        hidden = keras.layers.Dense(width, activation="relu" if i < layers - 1 else None)(hidden)
    model = keras.Model(inputs, hidden)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    x = np.random.default_rng(0).standard_normal((total_steps * BATCH, width), dtype=np.float32)

    marks: dict[int, float] = {}
    hooks: list[tuple[float, float]] = []
    saves: list[float] = []
    windows: list[tuple[float, float]] = []

    class StepTimer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            marks[batch + 1] = time.perf_counter()

    def time_hook(callback: Any, name: str, log: list[tuple[float, float]]) -> None:
        original = getattr(callback, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                log.append((start, time.perf_counter() - start))

        setattr(callback, name, timed)

    class WaitForPersistProcess(keras.callbacks.Callback):
        """Steady state: see the Lightning worker's twin."""

        def on_train_begin(self, logs: Any = None) -> None:
            if tracked is not None and getattr(tracked, "session", None) is not None:
                tracked.session.wait_for_persist_process()

    callbacks: list[Any] = [StepTimer()]
    tracked: Any = None
    if method.startswith("autockpt"):
        extra: dict[str, Any] = {"signals": ()} if "signals" in inspect.signature(AutoCheckpoint).parameters else {}
        tracked = AutoCheckpoint(
            directory, every_n_steps=every, keep_last=2, resume=False, verbose=False, save_on_train_end=False,
            persist_mode="thread" if method == "autockpt-thread" else "auto", **extra,
        )
        record_persist_windows(windows)
    elif method == "modelcheckpoint":
        tracked = keras.callbacks.ModelCheckpoint(
            os.path.join(directory, "weights.weights.h5"), save_weights_only=True, save_freq=every
        )
        original_save = tracked._save_model

        def timed_save(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original_save(*args, **kwargs)
            finally:
                saves.append(time.perf_counter() - start)

        tracked._save_model = timed_save
    elif method != "none":
        raise ValueError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
    if tracked is not None:
        time_hook(tracked, "on_train_batch_end", hooks)
        callbacks += [tracked, WaitForPersistProcess()]
    model.fit(x, x, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    state = list(model.variables) + list(model.optimizer.variables)
    nbytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in state)
    result: dict[str, Any] = {
        "case": "train", "framework": "keras", "backend": keras.backend.backend(), "method": method,
        "state_bytes": nbytes, "width": width, "layers": layers, "every": every, "steps": total_steps,
        "warmup": warm, **step_times(marks, warm, every),
    }
    if tracked is not None:
        result.update(stall_figures(hooks, marks, warm, every))
        result.update(overlap_figures(marks, hooks, windows, warm))
    if method.startswith("autockpt"):
        session = tracked.session
        records = session.records()
        result.update(
            persist_s=session.estimates().persist_s,
            file_bytes=records[-1].size if records else None,
            buffer_peak_bytes=session.buffers.peak_bytes,
            buffer_allocations=session.buffers.allocations,
            copy_mode="sync",
            persist_mode=session.persist_mode.mode,
            process_writes=session.process_writes,
        )
    elif method == "modelcheckpoint":
        path = os.path.join(directory, "weights.weights.h5")
        result.update(
            persist_s=statistics.median(saves) if saves else None,
            file_bytes=os.path.getsize(path) if os.path.exists(path) else None,
            fsync=False,
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autockpt_bench.workers.keras_bench")
    parser.add_argument("case", choices=("train",))
    parser.add_argument("--method", choices=METHODS, default="autockpt")
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--checkpoints", type=int, default=4)
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    emit(train(args.method, args.bytes, args.dir, args.every, args.checkpoints))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
