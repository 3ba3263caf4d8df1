"""Keras: signal handlers after a ``fit()`` that raised (real processes, real signals).

Keras has no hook for a ``fit()`` that raises, so ``on_train_end`` never runs there. The
handler must then stop deferring signals (a later SIGTERM terminates the process as it would
without autockpt), and the next ``fit()`` must finish the old session before starting its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import numpy as np
    import keras
    from autockpt_keras import AutoCheckpoint

    dirpath, mode = sys.argv[1], sys.argv[2]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    x, y = np.ones((64, 4), "float32"), np.ones((64, 1), "float32")

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("simulated crash")

    auto = AutoCheckpoint(dirpath, every_n_steps=2, warmup_steps=0, verbose=False)
    try:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[auto, Crash()])
    except RuntimeError:
        print("fit raised", flush=True)
    if mode == "signal":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(20)
        print("still alive", flush=True)
    else:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[auto])
        print(f"second fit ok steps={int(model.optimizer.iterations.numpy())} "
              f"handler_back={signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}", flush=True)
    """
)


def run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "fit_raises.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1",
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(script), str(tmp_path / "ck"), mode],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)


def test_sigterm_after_fit_raised_terminates_the_process(tmp_path: Path) -> None:
    proc = run(tmp_path, "signal")
    assert "fit raised" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert "still alive" not in proc.stdout


def test_next_fit_after_a_failed_one_finishes_the_old_session_and_trains(tmp_path: Path) -> None:
    proc = run(tmp_path, "refit")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # resumed from the step-2 checkpoint: the epoch of 8 batches ends at step 8
    assert "fit raised" in proc.stdout and "second fit ok steps=8 handler_back=True" in proc.stdout, proc.stdout
