"""One of two JAX processes (``jax.distributed`` over gloo on 127.0.0.1), for test_keras_jax_distributed.py.

    python tests/keras/jax_distributed_worker.py PROCESS_ID PORT DISTRIBUTION DIRPATH OUT

Trains a model with ``AutoCheckpoint`` under DISTRIBUTION: ``none`` (no keras.distribution:
each process would train a model of its own) or ``local`` (a ``DataParallel`` over this
process's devices only); writes OUT (JSON): the process count, the error ``fit()`` raised,
and whether DIRPATH exists afterwards.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

process_id, port, distribution = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dirpath, out = Path(sys.argv[4]), Path(sys.argv[5])
os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from autockpt_core import AutockptError  # noqa: E402
from autockpt_keras import AutoCheckpoint  # noqa: E402

if distribution == "local":
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.local_devices(), auto_shard_dataset=False))
keras.utils.set_random_seed(0)
inputs = keras.Input((4,))
model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
model.compile(optimizer="adam", loss="mse")
x = np.ones((32, 4), "float32")
result: dict[str, object] = {"processes": jax.process_count()}
try:
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[AutoCheckpoint(dirpath)])
    result["error"] = None
except AutockptError as exc:
    result["error"] = str(exc)
result["dirpath_exists"] = dirpath.exists()
out.write_text(json.dumps(result))
jax.distributed.shutdown()  # a barrier: both processes leave together

from tests.fault.child import exit_without_teardown  # noqa: E402

exit_without_teardown(0)  # as every multi-process test script (see there)
