"""A tiny Keras model for test_export.py: ``python export_worker.py DIR`` trains it with a checkpoint
every 3 steps and keeps its weights after each step in ``DIR/steps.npz`` (keys ``<step>/<path>``);
``build_model`` is what ``autockpt export --model export_worker.py:build_model`` calls."""

from __future__ import annotations

import sys

import keras
import numpy as np


def build_model() -> keras.Model:
    """Built (keras.Input) and compiled: what the training below trains."""
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.BatchNormalization(), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


class StepWeights(keras.callbacks.Callback):
    """After AutoCheckpoint in the list: the model's variables at the end of every step."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, np.ndarray] = {}

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        step = int(self.model.optimizer.iterations.numpy())
        for variable in self.model.variables:
            self.seen[f"{step}/{variable.path}"] = np.array(variable.numpy())


def main(dirpath: str) -> None:
    from autockpt_keras import AutoCheckpoint

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = build_model()
    steps = StepWeights()
    auto = AutoCheckpoint(dirpath=dirpath, every_n_steps=3, keep_last=10, verbose=False)
    model.fit(x, y, batch_size=16, epochs=2, callbacks=[auto, steps], verbose=0)
    np.savez(f"{dirpath}/steps.npz", **steps.seen)


if __name__ == "__main__":
    main(sys.argv[1])
