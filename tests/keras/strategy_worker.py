"""One worker of a 2-worker ``MultiWorkerMirroredStrategy`` on 127.0.0.1, for test_keras_strategies.py.

    python tests/keras/strategy_worker.py INDEX PORT0 PORT1 DIRPATH OUT

Builds a model under the strategy and starts ``AutoCheckpoint``'s ``fit()`` hook directly:
Keras 3.15's ``fit()`` fails under this strategy before any callback runs
(keras-team/keras#20585), so the hook is the first place the callback can refuse it. Writes
OUT (JSON): the error the hook raised, and whether DIRPATH exists afterwards.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

index, port0, port1, dirpath, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]), Path(sys.argv[5])
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"127.0.0.1:{port0}", f"127.0.0.1:{port1}"]},
    "task": {"type": "worker", "index": index},
})
os.environ["KERAS_BACKEND"] = "tensorflow"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402

from autockpt_core import AutockptError  # noqa: E402
from autockpt_keras import AutoCheckpoint  # noqa: E402

with strategy.scope():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="adam", loss="mse")
callback = AutoCheckpoint(dirpath)
callback.set_model(model)
result: dict[str, object] = {"strategy": type(strategy).__name__}
try:
    callback.on_train_begin()
    result["error"] = None
except AutockptError as exc:
    result["error"] = str(exc)
result["dirpath_exists"] = dirpath.exists()
out.write_text(json.dumps(result))
