"""Keras on the torch backend with the model on CUDA, for tests/gpu/test_cuda_paths.py.

    KERAS_BACKEND=torch python tests/gpu/keras_cuda_worker.py first  WORKDIR
    KERAS_BACKEND=torch python tests/gpu/keras_cuda_worker.py resume WORKDIR

``first``: a fit with AutoCheckpoint (every EVERY steps) that crashes after step CRASH_AT;
records, at each checkpoint, every model/optimizer/metric variable and whether the session's
host buffers are pinned, then compares each committed file with the variables of its step;
then two uninterrupted fits without the callback (is training deterministic here?). ``resume``: the same
fit in a new process, same directory: resumes from the newest checkpoint (mid-epoch), compares
the restored variables with the file, and trains to the end. Each phase writes
WORKDIR/<phase>.json (``error`` holds a traceback if it failed).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

import numpy as np  # noqa: E402
import keras  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from autockpt_core import read_manifest, storage_for  # noqa: E402
from autockpt_keras import AutoCheckpoint  # noqa: E402
from autockpt_keras.state import collect_state  # noqa: E402

SAMPLES, BATCH, EPOCHS = 320, 16, 3  # 20 steps per epoch, 60 in all
EVERY, CRASH_AT = 4, 30
NEWEST = (CRASH_AT // EVERY) * EVERY  # 28: mid-epoch (epoch 1, batch 8)
TOTAL = EPOCHS * SAMPLES // BATCH
GROUPS = ("model", "optimizer")


def make_model() -> Any:
    model = keras.Sequential(
        [
            keras.Input((8,), name="x"),
            keras.layers.Dense(512, activation="relu", name="hidden"),
            keras.layers.BatchNormalization(name="bn"),
            keras.layers.Dropout(0.1, name="drop"),
            keras.layers.Dense(512, activation="relu", name="hidden2"),
            keras.layers.Dense(1, name="out"),
        ],
        name="net",
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3, name="adam"), loss="mse")
    return model


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 8)).astype("float32")
    return x, (x @ rng.normal(size=(8, 1))).astype("float32")


def values(model: Any, groups: tuple[str, ...] = GROUPS) -> dict[str, np.ndarray]:
    return {e.key: np.array(e.variable.numpy(), copy=True) for e in collect_state(model, groups)}


def digest(model: Any) -> str:
    """SHA-256 of every model and optimizer variable's bytes, in collect_state's order (not
    their names: a second model built in one process gets other names)."""
    h = hashlib.sha256()
    for value in values(model).values():
        h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()


def pinned_count(auto: AutoCheckpoint) -> list[int]:
    arrays = [entry[2] for entry in auto.session.buffers._buffers.values()]
    arrays = [a for a in arrays if a.size]
    pinned = sum(bool(torch.from_numpy(np.ascontiguousarray(a).reshape(-1).view(np.uint8)).is_pinned())
                 for a in arrays if a.flags["C_CONTIGUOUS"])
    return [pinned, len(arrays)]


class Capture(keras.callbacks.Callback):
    """After AutoCheckpoint: the variables and buffers at each checkpoint."""

    def __init__(self, auto: AutoCheckpoint) -> None:
        super().__init__()
        self.auto = auto
        self.states: dict[int, dict[str, np.ndarray]] = {}
        self.digests: dict[int, str] = {}
        self.pinned: list[list[int]] = []
        self.seen = 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._check()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._check()  # a checkpoint at an epoch's last batch is taken at the epoch's end

    def _check(self) -> None:
        if len(self.auto.events) == self.seen:
            return
        self.seen = len(self.auto.events)
        step = self.auto.events[-1].step
        if int(self.model.optimizer.iterations.numpy()) != step:
            return  # seen too late to capture its state (not compared)
        self.states[step] = values(self.model, ("model", "optimizer", "metrics"))
        self.digests[step] = digest(self.model)
        self.pinned.append(pinned_count(self.auto))


class Crash(keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if int(self.model.optimizer.iterations.numpy()) >= CRASH_AT:
            raise RuntimeError("simulated crash")


class Probe(keras.callbacks.Callback):
    """After AutoCheckpoint in the resumed fit: the restored state, compared with the file."""

    def __init__(self, auto: AutoCheckpoint) -> None:
        super().__init__()
        self.auto = auto
        self.out: dict[str, Any] = {}

    def on_train_begin(self, logs: Any = None) -> None:
        info = self.auto.restored
        self.out["restored_step"] = None if info is None else info.step
        self.out["iterations_at_begin"] = int(self.model.optimizer.iterations.numpy())
        self.out["digest_at_begin"] = digest(self.model)
        if info is not None:
            saved = load_file(info.path)
            current = values(self.model)
            self.out["restore_compared"] = len(current)
            self.out["restore_mismatched"] = [
                k for k, v in current.items() if k not in saved or not np.array_equal(v, saved[k].astype(v.dtype))
            ]


def fit(model: Any, callbacks: list[Any]) -> None:
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=callbacks, shuffle=True)


def uninterrupted() -> str:
    keras.utils.set_random_seed(0)
    model = make_model()
    fit(model, [])
    return digest(model)


def first(workdir: Path) -> dict[str, Any]:
    """The crashing fit first: its model is this process's first, so its variable names (the
    checkpoint keys) are those the resumed process's model gets."""
    out: dict[str, Any] = {"total_steps": TOTAL, "newest_expected": NEWEST}
    keras.utils.set_random_seed(0)
    model = make_model()
    out["variable_device"] = str(model.weights[0].value.device)
    dirpath = workdir / "ck"
    auto = AutoCheckpoint(dirpath, every_n_steps=EVERY, keep_last=100, warmup_steps=2, verbose=False)
    capture = Capture(auto)
    try:
        fit(model, [auto, capture, Crash()])
        raise AssertionError("the fit did not crash")
    except RuntimeError as exc:
        if "simulated crash" not in str(exc):
            raise
    out["persist_mode"] = auto.session.persist_mode.mode if auto.session is not None else None
    out["saved_steps"] = [e.step for e in auto.events]
    out["stall_ms"] = [round(e.stall_s * 1e3, 3) for e in auto.events]
    out["pinned"] = capture.pinned
    out["digests"] = {str(k): v for k, v in capture.digests.items()}
    deadline = time.monotonic() + 60  # the fit watch ends the session (last persist) within ~0.5 s
    records = []
    while time.monotonic() < deadline:
        records = read_manifest(storage_for(dirpath))
        if records and max(r.step for r in records) >= NEWEST:
            break
        time.sleep(0.2)
    time.sleep(1.0)  # let the watch release the session before the process ends
    mismatches, compared = [], 0
    for record in records:
        expected = capture.states.get(record.step)
        if expected is None:
            continue
        saved = load_file(str(dirpath / record.name))
        compared += 1
        for key, value in expected.items():
            if key not in saved or not np.array_equal(value, saved[key].astype(value.dtype)):
                mismatches.append(f"step {record.step}: {key}")
    out["committed_steps"] = sorted(r.step for r in records)
    out["files_compared"] = compared
    out["file_mismatches"] = mismatches
    digests = [uninterrupted(), uninterrupted()]
    out["baseline_digest"] = digests[0]
    out["baseline_deterministic"] = digests[0] == digests[1]
    return out


def resume(workdir: Path) -> dict[str, Any]:
    keras.utils.set_random_seed(0)
    model = make_model()
    auto = AutoCheckpoint(workdir / "ck", every_n_steps=EVERY, keep_last=100, warmup_steps=2, verbose=False)
    probe = Probe(auto)
    fit(model, [auto, probe])
    out = probe.out
    out["iterations_at_end"] = int(model.optimizer.iterations.numpy())
    out["final_digest"] = digest(model)
    out["saved_steps"] = [e.step for e in auto.events]
    return out


def main() -> None:
    phase, workdir = sys.argv[1], Path(sys.argv[2])
    result: dict[str, Any] = {"backend": keras.backend.backend(), "keras": keras.__version__,
                              "cuda": torch.cuda.is_available()}
    try:
        result.update(first(workdir) if phase == "first" else resume(workdir))
    except BaseException:
        result["error"] = traceback.format_exc()
    (workdir / f"{phase}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
