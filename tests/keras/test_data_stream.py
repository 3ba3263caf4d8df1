"""The callback keeps no exhausted data iterator alive: each is destroyed where Keras drops it.

Destroying a tf.data iterator can block for seconds (its destructor waits for the autotuning
thread, which can miss the cancellation's wake-up and sleep out its period). Keras drops an
epoch's iterator when the next epoch's first batch is drawn; the callback's stream must not
hold it until its own batch hook, where that wait would count as the callback's time. A real
``fit()`` on the TensorFlow backend in a fresh process (the backend is fixed at import). After
``fit()`` the callback holds no data iterator either (torch backend, a DataLoader with workers).
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
    import json, sys, weakref
    import keras, numpy as np
    from autockpt_keras import AutoCheckpoint
    from autockpt_keras.fit_frame import find_fit_frame

    class Probe(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen, self.kept = [], []

        def on_train_batch_begin(self, batch, logs=None):
            current = find_fit_frame(self.model).f_locals["epoch_iterator"]._current_iterator
            self.kept.append(sum(1 for ref in self.seen if ref() is not None and ref() is not current))

        def on_train_batch_end(self, batch, logs=None):
            current = find_fit_frame(self.model).f_locals["epoch_iterator"]._current_iterator
            if not any(ref() is current for ref in self.seen):
                self.seen.append(weakref.ref(current))

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    auto, probe = AutoCheckpoint(sys.argv[1], every_n_steps=3, verbose=False), Probe()
    model.fit(np.ones((16, 4)), np.ones((16, 2)), batch_size=4, epochs=4, callbacks=[auto, probe], verbose=0)
    print(json.dumps({"kept": probe.kept, "iterators": len(probe.seen), "checkpoints": len(auto.events)}))
    """
)


def test_an_exhausted_epoch_iterator_is_released_where_keras_drops_it(tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed")
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ck")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["iterators"] == 4 and result["checkpoints"] >= 4  # one iterator per epoch; the callback ran
    assert result["kept"] == [0] * 16, "an earlier epoch's iterator was still alive at a batch's start"


AFTER_FIT = textwrap.dedent(
    """
    import gc, json, multiprocessing, sys
    import keras, numpy as np, torch
    from torch.utils.data import DataLoader, TensorDataset
    from autockpt_keras import AutoCheckpoint

    gc.disable()  # only references count: a cycle would be collected at some later moment
    data = TensorDataset(torch.ones(16, 4), torch.ones(16, 2))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    auto = AutoCheckpoint(sys.argv[1], every_n_steps=3, verbose=False)
    model.fit(DataLoader(data, batch_size=4, num_workers=2), epochs=2, callbacks=[auto], verbose=0)
    print(json.dumps({"workers_alive": len(multiprocessing.active_children()), "checkpoints": len(auto.events)}))
    """
)


def test_no_data_loader_worker_outlives_fit_while_the_callback_is_kept(tmp_path: Path) -> None:
    """Keras makes the next epoch's DataLoader iterator (workers started) after each epoch's
    last batch and drops it with ``fit()``'s epoch iterator; the callback, which the user
    keeps, must not hold that iterator: idle workers shut down late wait seconds each."""
    env = dict(os.environ, KERAS_BACKEND="torch", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", AFTER_FIT, str(tmp_path / "ck")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["checkpoints"] >= 2 and result["workers_alive"] == 0, result
