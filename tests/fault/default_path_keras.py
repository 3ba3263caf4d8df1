"""A Keras job as users write it, run by test_default_path.py under ``ulimit -Sn 1024``.

    KERAS_BACKEND=tensorflow python tests/fault/default_path_keras.py DIRPATH MIN_PROCESS_WRITES OUT.json

``AutoCheckpoint(DIRPATH)`` with default settings (the persist process, the budget policy);
a model of 200 Dense layers built from a dataclass of hyper-parameters defined here (400
weights, 800 optimizer slots). It trains until the persist process has written
MIN_PROCESS_WRITES checkpoints (at most EPOCHS epochs); a rerun of the same command resumes.
Writes OUT.json.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

import keras  # noqa: E402
import numpy as np  # noqa: E402

from autockpt_core import read_manifest, storage_for  # noqa: E402
from tests.fault.child import report  # noqa: E402
from autockpt_keras import AutoCheckpoint  # noqa: E402

EPOCHS = 400


@dataclasses.dataclass
class HParams:
    layers: int = 200
    width: int = 4
    lr: float = 1e-3


class Observe(keras.callbacks.Callback):
    """Stops once the persist process wrote enough; records descriptors in use at each step."""

    def __init__(self, auto: AutoCheckpoint, min_process_writes: int) -> None:
        super().__init__()
        self.auto, self.min_writes = auto, min_process_writes
        self.start_step: int | None = None
        self.peak_fds = 0

    def on_train_begin(self, logs: Any = None) -> None:
        self.start_step = int(self.model.optimizer.iterations)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.peak_fds = max(self.peak_fds, len(os.listdir("/proc/self/fd")))
        session = self.auto.session
        if session is not None and session.process_writes >= self.min_writes:
            self.model.stop_training = True


def build(hp: HParams) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((hp.width,))
    x = inputs
    for i in range(hp.layers):
        x = keras.layers.Dense(hp.width, activation="tanh", name=f"dense_{i}")(x)
    model = keras.Model(inputs, x)
    model.compile(optimizer=keras.optimizers.Adam(hp.lr), loss="mse")
    return model


def main(dirpath: str, min_process_writes: int) -> dict[str, Any]:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(256, 4)).astype("float32"), rng.uniform(size=(256, 4)).astype("float32")
    model = build(HParams())
    auto = AutoCheckpoint(dirpath)
    observe = Observe(auto, min_process_writes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8, epochs=EPOCHS, callbacks=[auto, observe], verbose=0)
    session = auto.session
    assert session is not None
    return {
        "soft_limit": soft,
        "tensors": len(model.weights) + len(model.optimizer.variables),
        "start_step": observe.start_step,
        "final_step": int(model.optimizer.iterations),
        "events": [e.step for e in auto.events],
        "persist_mode": session.persist_mode.mode,
        "process_writes": session.process_writes,
        "peak_fds": observe.peak_fds,
        "records": [r.step for r in read_manifest(storage_for(dirpath))],
        "autockpt_warnings": [str(w.message) for w in caught if "persist process" in str(w.message)],
    }


if __name__ == "__main__":
    report(lambda: main(sys.argv[1], int(sys.argv[2])), sys.argv[3])
