"""Keras' own checkpointing beside autockpt (autockpt_keras/fit_guard.py, core
other_checkpoints.py): ModelCheckpoint's and BackupAndRestore's saves are in the summary line, and
a BackupAndRestore that restores after autockpt's resume is named (ResumeNotExactWarning). A
real process on TensorFlow (the backend is fixed at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("keras")
pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys, time, warnings
    import keras, numpy as np
    from autockpt_core import CheckpointSession, Config, DirectoryLockedError, ResumeNotExactWarning
    from autockpt_keras import AutoCheckpoint

    class Breaks(keras.callbacks.Callback):  # the first run dies in its second epoch
        def on_train_batch_end(self, batch, logs=None):
            if self.params and batch == 5 and self.model.optimizer.iterations.numpy() > 16:
                raise RuntimeError("killed")

    root = sys.argv[1]
    keras.utils.set_random_seed(0)
    x, y = np.random.rand(64, 4).astype("float32"), np.random.rand(64, 2).astype("float32")

    def run(extra):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse")
        auto = AutoCheckpoint(root + "/ck", every_n_steps=4, verbose=False)
        native = [keras.callbacks.ModelCheckpoint(root + "/m.weights.h5", save_weights_only=True),
                  keras.callbacks.BackupAndRestore(root + "/backup")]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                model.fit(x, y, batch_size=4, epochs=3, callbacks=[auto, *native, *extra], verbose=0)
            except RuntimeError as exc:
                if str(exc) != "killed":
                    raise
        named = [str(w.message) for w in seen if w.category is ResumeNotExactWarning and "BackupAndRestore" in str(w.message)]
        return auto, named, model

    first, named_first, _ = run([Breaks()])
    deadline = time.monotonic() + 10  # the failed fit's session lets go of the directory lock once fit() is gone
    while time.monotonic() < deadline:
        try:
            probe = CheckpointSession(Config(dirpath=root + "/ck", verbose=False), framework="keras", suffix=".safetensors")
            probe.open()
            probe.close()
            break
        except DirectoryLockedError:
            time.sleep(0.2)
    second, named, model = run([])
    print(json.dumps({"first_named": named_first, "named": named, "resumed": second.restored.step,
                      "line": second.summary.line(), "own": "save_weights" in vars(model)}))
    """
)


def test_keras_own_saves_are_timed_and_a_later_restore_is_named(tmp_path: Path) -> None:
    env = dict(os.environ, KERAS_BACKEND="tensorflow", OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["first_named"] == [] and result["resumed"] == 20  # the run died in step 22: checkpoint 20
    assert len(result["named"]) == 1, result
    assert "load_weights(" in result["named"][0] and "ran after autockpt resumed step 20" in result["named"][0]
    # the resumed run's epochs 2 and 3 end: ModelCheckpoint and BackupAndRestore save at each
    assert "; beside it, Keras' own checkpointing saved 4 times in " in result["line"], result["line"]
    assert result["own"] is False  # model.save_weights is the class's again
