"""What AutoCheckpoint costs per training step in Keras when no checkpoint is taken.

Trains an MLP of ``--layers`` dense layers of ``--width`` (Adam, batch 64, one thread) on
one Keras backend, ``--rounds`` times in turn: without callbacks, with a callback that only
reads ``Callback.model`` at each batch end (on JAX that property reattaches fit()'s whole
state to the variables at every access: the cost a naive callback pays), and with
``AutoCheckpoint`` (``every_n_steps`` beyond the run, no final checkpoint), so the difference
is the callback's per-step work: the step read, profiling, the policy. Reports the median
step time (steps 50 and later). Prints a table and writes ``--json``.

    python examples/keras_step_overhead.py --backend jax --layers 40 --width 64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keras_example_setup import use_backend


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="jax", choices=["jax", "tensorflow", "torch"])
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the results here")
    return parser.parse_args(argv)


ARGS = _parse(sys.argv[1:] if __name__ == "__main__" else [])
use_backend(ARGS.backend)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from autockpt_keras import AutoCheckpoint  # noqa: E402


class StepTimes(keras.callbacks.Callback):
    def on_train_begin(self, logs: Any = None) -> None:
        self.times: list[float] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.times.append(time.perf_counter())


class ReadsModel(keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.model  # noqa: B018 - the property access is the point


def _model() -> Any:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((ARGS.width,))
    h = inputs
    for _ in range(ARGS.layers):
        h = keras.layers.Dense(ARGS.width, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse")
    return model


def _median_step_ms(variant: str, x: np.ndarray, y: np.ndarray, workdir: str) -> float:
    model, timer = _model(), StepTimes()
    callbacks: list[Any] = [timer]
    if variant == "reads Callback.model":
        callbacks.insert(0, ReadsModel())
    elif variant == "AutoCheckpoint":
        callbacks.insert(0, AutoCheckpoint(tempfile.mkdtemp(dir=workdir), every_n_steps=10**9,
                                           save_on_train_end=False, verbose=False))
    model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=callbacks)
    return statistics.median(b - a for a, b in zip(timer.times[50:], timer.times[51:])) * 1e3


def main() -> int:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * ARGS.steps, ARGS.width)).astype("float32")
    y = rng.normal(size=(64 * ARGS.steps, 1)).astype("float32")
    variants = ["none", "reads Callback.model", "AutoCheckpoint"]
    times: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as workdir:
        for _ in range(ARGS.rounds):
            for variant in variants:
                times[variant].append(_median_step_ms(variant, x, y, workdir))
    base = statistics.median(times["none"])
    print(f"Keras {keras.__version__}, backend {ARGS.backend}, MLP {ARGS.layers}x{ARGS.width}, "
          f"{ARGS.steps} steps x {ARGS.rounds} rounds")
    print("| callbacks | median step (ms), per round | vs none |")
    print("|---|---|---|")
    for variant in variants:
        med = statistics.median(times[variant])
        print(f"| {variant} | {', '.join(f'{t:.2f}' for t in times[variant])} | {100 * (med / base - 1):+.0f}% |")
    if ARGS.json:
        machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()}
        Path(ARGS.json).write_text(json.dumps({"machine": machine, "args": vars(ARGS), "step_ms": times}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
