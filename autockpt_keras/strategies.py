"""Which ``tf.distribute`` strategies the Keras callback serves, checked when ``fit()`` starts.

One process drives the whole training with the default strategy, ``OneDeviceStrategy`` and
``MirroredStrategy`` (the devices of one machine): the callback reads every variable from
that process (a mirrored variable's primary copy; a metric's per-device partial values
summed) and assigns restored values to all copies, so nothing changes for them. Strategies
whose training spans several processes (``MultiWorkerMirroredStrategy`` with more than one
worker, ``ParameterServerStrategy``) or a TPU are refused with an error naming the fix: every
worker would write the same directory, and no worker agrees with the others on when to
checkpoint or where to resume. (Keras 3.15's ``fit()`` does not run under
``MultiWorkerMirroredStrategy`` at all yet, keras-team/keras#20585: it fails before the first
callback hook.)

Call order and threading: :func:`check_strategy` once, at the start of ``on_train_begin``,
on the training thread, before anything is read or written.
"""

from __future__ import annotations

import sys
from typing import Any

from autockpt_core import AutockptError

#: Strategies that keep the whole training in this process.
ONE_PROCESS = ("_DefaultDistributionStrategy", "OneDeviceStrategy", "MirroredStrategy")
#: Class names under their public names (``tf.distribute.MultiWorkerMirroredStrategy`` objects
#: are ``CollectiveAllReduceStrategy`` instances).
PUBLIC_NAMES = {"CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy"}


def model_strategy(model: Any) -> Any | None:
    """The ``tf.distribute.Strategy`` the model was built under (None: none, or another backend)."""
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None and "tensorflow" in sys.modules:
        import tensorflow as tf

        if tf.distribute.has_strategy():
            strategy = tf.distribute.get_strategy()
    return strategy


def workers(strategy: Any) -> int:
    """How many worker processes take part in ``strategy`` (1 for one-process strategies)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    return max(1, sum(len(tasks) for job, tasks in spec.items() if job in ("chief", "worker")))


def check_strategy(model: Any) -> None:
    """Raise :class:`~autockpt_core.AutockptError` for a strategy the callback cannot serve."""
    strategy = model_strategy(model)
    if strategy is None:
        return
    name = PUBLIC_NAMES.get(type(strategy).__name__, type(strategy).__name__)
    count = workers(strategy)
    if name in ONE_PROCESS and count == 1:
        return
    if name == "MultiWorkerMirroredStrategy" and count == 1:
        return  # one worker: the training stays in this process
    detail = f" with {count} workers" if count > 1 else ""
    raise AutockptError(
        f"AutoCheckpoint supports tf.distribute strategies that train in one process (MirroredStrategy, "
        f"OneDeviceStrategy), not {name}{detail}. Fix: train in one process per job with MirroredStrategy "
        "over the machine's devices, or use keras.callbacks.BackupAndRestore for multi-worker training."
    )
