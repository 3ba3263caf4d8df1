"""Which ``tf.distribute`` strategies (and JAX process layouts) the Keras callback serves,
checked when ``fit()`` starts.

One process drives the whole training with the default strategy, ``OneDeviceStrategy`` and
``MirroredStrategy`` (the devices of one machine): the callback reads every variable in
that process (each device's copy of the non-trainable ones, :mod:`autockpt_keras.state`)
and assigns the restored values to every device. Strategies
whose training spans several processes (``MultiWorkerMirroredStrategy`` with more than one
worker, ``ParameterServerStrategy``) or a TPU are refused with an error naming the fix: every
worker would write the same directory, and no worker agrees with the others on when to
checkpoint or where to resume. (Keras 3.15's ``fit()`` does not run under
``MultiWorkerMirroredStrategy`` at all yet, keras-team/keras#20585: it fails before the first
callback hook.) On JAX, a job that spans processes (``jax.distributed``, e.g. a Keras
``DataParallel`` distribution over several hosts) is refused for the same reasons.

Call order and threading: :func:`check_strategy` once, at the start of ``on_train_begin``,
on the training thread, before anything is read or written.
"""

from __future__ import annotations

import sys
from typing import Any

from autockpt_core import AutockptError

#: Strategies that keep the whole training in this process (MultiWorkerMirroredStrategy: with one worker).
ONE_PROCESS = ("_DefaultDistributionStrategy", "OneDeviceStrategy", "MirroredStrategy", "MultiWorkerMirroredStrategy")
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


def jax_processes() -> int:
    """How many processes a JAX job spans (``jax.distributed``); 1 without JAX."""
    jax = sys.modules.get("jax")
    return int(jax.process_count()) if jax is not None else 1


def check_strategy(model: Any, backend: str = "tensorflow") -> None:
    """Raise :class:`~autockpt_core.AutockptError` for a setup the callback cannot serve."""
    if backend == "jax":
        count = jax_processes()
        if count > 1:
            raise AutockptError(
                f"AutoCheckpoint runs in one process, but this JAX job spans {count} processes "
                "(jax.distributed). Fix: train in one process (a keras.distribution over its local devices), "
                "or checkpoint multi-process JAX jobs with keras.callbacks.BackupAndRestore or Orbax."
            )
        return
    strategy = model_strategy(model)
    if strategy is None:
        return
    name = PUBLIC_NAMES.get(type(strategy).__name__, type(strategy).__name__)
    count = workers(strategy)
    if name in ONE_PROCESS and count == 1:
        return
    detail = f" with {count} workers" if count > 1 else ""
    raise AutockptError(
        f"AutoCheckpoint supports tf.distribute strategies that train in one process (MirroredStrategy, "
        f"OneDeviceStrategy), not {name}{detail}. Fix: train in one process per job with MirroredStrategy "
        "over the machine's devices, or use keras.callbacks.BackupAndRestore for multi-worker training."
    )
