"""Shared by the Keras example benchmarks: pick the backend and keep it on one thread.

Call :func:`use_backend` before anything imports Keras (the backend is fixed at import).
"""

from __future__ import annotations

import os


def use_backend(backend: str) -> None:
    """Set ``KERAS_BACKEND``, quiet TensorFlow, and cap the backend's threads at one."""
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
