"""A Keras ``fit()`` that raises outside autockpt's hooks releases the session and the lock.

Keras calls no hook when a step or another callback raises, and a notebook keeps the exception
(and with it the callback) alive: before, a new callback on the same ``dirpath`` then got
``DirectoryLockedError`` until the next ``fit()`` or a garbage collection. A real process per
backend (the backend is fixed at import).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import keras, numpy as np
    from autockpt_core import CheckpointSession, Config, DirectoryLockedError
    from autockpt_keras import AutoCheckpoint

    class Breaks(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 6:
                raise RuntimeError("a bug in the user's callback")

    dirpath = sys.argv[1]
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    auto = AutoCheckpoint(dirpath, every_n_steps=2, verbose=False)
    kept = None
    try:
        model.fit(np.ones((64, 4)), np.ones((64, 2)), batch_size=4, epochs=1, callbacks=[auto, Breaks()], verbose=0)
    except RuntimeError as exc:
        kept = exc  # as a notebook keeps sys.last_traceback: the callback stays alive
    assert kept is not None
    deadline, other = time.monotonic() + 10, None
    while time.monotonic() < deadline:
        other = CheckpointSession(Config(dirpath=dirpath, verbose=False), framework="keras", suffix=".safetensors")
        try:
            other.open()
            break
        except DirectoryLockedError:
            other = None
            time.sleep(0.2)
    released = other is not None
    if other is not None:
        other.close()
    print(json.dumps({"released": released, "steps": [e.step for e in auto.events],
                      "buffers": auto.session.buffers.total_bytes}))
    """
)


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_a_fit_that_raised_in_another_callback_releases_the_lock_without_a_new_fit(tmp_path: Path, backend: str) -> None:
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    env = {**os.environ, "KERAS_BACKEND": backend, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ckpts")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["released"], "the directory lock was still held after fit() raised"
    assert result["steps"] == [2, 4, 6] and result["buffers"] == 0
