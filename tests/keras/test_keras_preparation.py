"""A checkpoint due while TensorFlow still traces the batched read waits for it at the next steps.

The Keras adapter traces its read in a helper thread from the first trained batch; a checkpoint
taken before that trace ends waited for the rest of it on the training thread (1.9 s with 1,202
variables). Here the trace is slowed to 1.5 s: the policy's first (profiling) checkpoint, due
a few steps in, is taken at the first step end after the trace, without the wait. A real
process (the backend is fixed at import).
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
    from autockpt_keras import AutoCheckpoint
    from autockpt_keras.copying import TensorFlowCopier

    traced = {}
    original = TensorFlowCopier._warm

    def slow_warm(self, entries):
        time.sleep(1.5)  # a model with many variables
        original(self, entries)
        traced["at"] = time.perf_counter()

    TensorFlowCopier._warm = slow_warm

    class Steps(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = {}

        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.01)  # 10 ms steps: the trace lasts ~150 of them
            self.ends[len(self.ends) + 1] = time.perf_counter()

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    auto, steps = AutoCheckpoint(sys.argv[1], overhead_budget=0.05, verbose=False), Steps()
    model.fit(np.ones((64, 4)), np.ones((64, 2)), batch_size=4, epochs=20, callbacks=[auto, steps], verbose=0)
    first = auto.events[0]
    print(json.dumps({"steps": [e.step for e in auto.events], "reason": first.reason, "stall": first.stall_s,
                      "traced_before_first": traced["at"] < steps.ends[first.step]}))
    """
)


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="tensorflow is not installed")
def test_a_checkpoint_due_during_the_reads_trace_is_taken_after_it_without_waiting(tmp_path: Path) -> None:
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ckpts")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    first = result["steps"][0]
    assert result["reason"].startswith("profiling") and ": a one-time preparation was still running)" in result["reason"]
    due = int(result["reason"].split("deferred from step ")[1].split(":")[0])
    assert due < first  # put off from the step it was due at
    assert result["traced_before_first"]
    assert result["stall"] < 0.5  # it did not wait for the rest of the 1.5 s trace
    assert result["steps"][-1] == 320  # the final checkpoint
