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
callback hook.) On JAX, a job that spans processes (``jax.distributed``) is served under a
Keras ``DataParallel`` distribution over every process's devices (:func:`check_jax_processes`):
process 0 writes, and every process agrees with it at each step
(:mod:`autockpt_keras.processes`).

Call order and threading: :func:`check_strategy` once, at the start of ``on_train_begin``,
on the training thread, before anything is read or written.
"""

from __future__ import annotations

import sys
from typing import Any

from autockpt_core import AutockptError

from . import internals

#: Strategies that keep the whole training in this process (MultiWorkerMirroredStrategy: with one worker).
ONE_PROCESS = ("_DefaultDistributionStrategy", "OneDeviceStrategy", "MirroredStrategy", "MultiWorkerMirroredStrategy")
#: Class names under their public names (``tf.distribute.MultiWorkerMirroredStrategy`` objects
#: are ``CollectiveAllReduceStrategy`` instances).
PUBLIC_NAMES = {"CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy"}


def model_strategy(model: Any) -> Any | None:
    """The ``tf.distribute.Strategy`` the model was built under (None: none, or another backend)."""
    strategy = internals.model_strategy(model)
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
        check_jax_processes()
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


def check_jax_processes() -> None:
    """A JAX job over several processes needs a ``DataParallel`` distribution over all their devices.

    Then every variable is replicated on every device, process 0 reads the whole state from its
    own copies, and every process assigns the same values on resume. Without a distribution
    each process would train a model of its own; a ``ModelParallel`` layout splits variables
    over processes, which process 0 cannot read alone.
    """
    count = jax_processes()
    if count <= 1:
        return
    import jax
    import keras

    distribution = keras.distribution.distribution()
    name = type(distribution).__name__ if distribution is not None else "no keras.distribution"
    fix = (
        "Fix: keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices())) "
        "before the model is built, or checkpoint model-parallel JAX jobs with Orbax."
    )
    if not isinstance(distribution, keras.distribution.DataParallel):
        raise AutockptError(
            f"AutoCheckpoint supports a JAX job over {count} processes (jax.distributed) under a "
            f"keras.distribution.DataParallel over every process's devices, not {name}. {fix}"
        )
    devices = len(distribution.device_mesh.devices.reshape(-1))
    if devices != jax.device_count():
        raise AutockptError(
            f"AutoCheckpoint needs the DataParallel distribution of a JAX job over {count} processes to span "
            f"every process's devices ({jax.device_count()}), but it spans {devices}. {fix}"
        )
