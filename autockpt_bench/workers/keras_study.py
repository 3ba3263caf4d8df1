"""Keras worker of ``autockpt compare`` and ``autockpt goodput``: one case per process.

``python -m autockpt_bench.workers.keras_study {train,restore,goodput} --spec SPEC.json``
runs one case of the contract in :mod:`autockpt_bench.study.protocol` on the spec's
``keras_backend`` (default tensorflow; set with the thread caps before Keras is imported;
TensorFlow runs with ``enable_op_determinism`` and tf.data's autotuning off: see
:func:`input_without_autotuning`). The models are :mod:`.keras_models`; one epoch
is ``make_data(workload, steps_per_epoch)`` fed as numpy arrays with ``shuffle=False``.

Methods (``train`` and ``restore``): ``none``; ``autockpt`` / ``autockpt-budget``
(:class:`~autockpt_keras.AutoCheckpoint`, keep 2, resumed by its auto-resume); ``autockpt-ab``
(train only: ``every_n_steps=every`` in the alternating blocks of
:mod:`autockpt_bench.study.in_process_ab`);
``modelcheckpoint-h5`` / ``modelcheckpoint-keras`` (``ModelCheckpoint`` to
``ckpt-e{epoch}-b{batch}.weights.h5`` / ``.keras``; resumed with build + compile + optimizer
build + ``load_weights`` / with ``load_model``, then ``fit(initial_epoch=step // steps_per_epoch)``:
the interrupted epoch is replayed from its first batch); ``backup-restore`` (``BackupAndRestore``,
which restores the weights and the epoch and replays it); ``orbax`` (``OrbaxCheckpoint(
save_on_background=True, max_to_keep=2)``; resumed with ``model.load_weights(dir)``, which
loads the newest step, then the epoch as above); ``tf-manager`` (``tf.train.Checkpoint`` over
the model and optimizer with a ``CheckpointManager(max_to_keep=2)``, saved synchronously by a
small callback; restored with ``checkpoint.restore(manager.latest_checkpoint)``; TensorFlow
backend only). A method that cannot run here (orbax not installed, tf-manager on another
backend) writes ``{"framework", "workload", "method", "skipped": why}`` and exits 0.

The cases live in :mod:`.keras_train`, :mod:`.keras_restore` and :mod:`.keras_goodput`; this
module sets the backend up before any of them imports Keras and dispatches.
"""

from __future__ import annotations

import time

_STARTED = time.time()  # the goodput "start" event: before Keras and TensorFlow are imported

import os
import sys
from typing import Any

from ..study.protocol import EventLog, write_json
from ..study.workloads import Workload
from .keras_goodput import run_goodput
from .keras_job import Job
from .keras_methods import skip_reason
from .keras_restore import run_restore
from .keras_train import run_train
from .study_common import serve, setup_threads


def setup_backend(spec: dict[str, Any]) -> str:
    """``KERAS_BACKEND`` and the thread caps, before Keras is imported; TF op determinism."""
    backend = spec.get("keras_backend") or "tensorflow"
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    threads = int(spec.get("threads") or 0)
    setup_threads(threads)
    if backend == "tensorflow":
        import tensorflow as tf

        if threads > 0:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.experimental.enable_op_determinism()
        input_without_autotuning()
    elif backend == "torch":
        import torch

        if threads > 0:
            torch.set_num_threads(threads)
    return backend


def input_without_autotuning() -> None:
    """The tf.data input Keras builds from the arrays, with tf.data's autotuning off (every method).

    Destroying an autotuned iterator (Keras drops each epoch's at the next epoch's first batch)
    waits for its autotuning thread, and that thread can miss the cancellation's wake-up
    (TensorFlow 2.21: ``CancellationManager`` runs the callbacks before it marks itself
    cancelled) and sleep out its optimization period, which doubles from 10 ms: a stall of up to
    ~20 s at an epoch of 20.5-41 s, with or without checkpoints. Which runs meet it depends on
    where their epoch ends against those periods, not on the method.
    """
    import tensorflow as tf
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    original = ArrayDataAdapter.get_tf_dataset

    def get_tf_dataset(self: Any) -> Any:
        options = tf.data.Options()
        options.autotune.enabled = False
        return original(self).with_options(options)

    ArrayDataAdapter.get_tf_dataset = get_tf_dataset



def run_case(case: str, workload: Workload, method: dict[str, Any], spec: dict[str, Any], log: EventLog | None) -> None:
    backend = setup_backend(spec)
    reason = skip_reason(method["name"], backend)
    if reason is not None:
        if log is not None:
            raise SystemExit(f"keras_study goodput: {reason}")
        write_json(spec["out"], {"framework": "keras", "workload": workload.name, "method": method["name"], "skipped": reason})
        return
    job = Job(workload, method, spec)
    if log is not None:
        run_goodput(job, log)
    elif case == "train":
        run_train(job)
    else:
        run_restore(job)


def main(argv: list[str] | None = None) -> int:
    return serve(argv, "python -m autockpt_bench.workers.keras_study", _STARTED, run_case)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
