"""The step of a JAX ``fit()`` without reattaching its state to the model.

Keras' JAX trainer keeps the training state outside the model's variables during an epoch
(``model._jax_state``, donated to each step) and puts it back with ``model.jax_state_sync()``
at the epoch's end, or whenever a callback reads ``Callback.model``, which syncs on every
access. A sync assigns every variable and makes the next step detach them again: measured
on the 2-core CPU machine (``examples/keras_step_overhead.py``), a 40-layer MLP's median
step went from 2.3 to 4.2 ms for a callback that only reads ``self.model`` at each batch
end. So the callback reads the step from the detached optimizer state here, per batch, and
only the snapshot syncs (:class:`~autockpt_keras.copying.JaxCopier`).

Keras internals used (through :mod:`autockpt_keras.internals`): ``_jax_state["optimizer_variables"]``
(in the order of ``optimizer.variables``) and ``_jax_state_synced``; without them the state is
reattached (``jax_state_sync()``) to read the step.

Under ``jax.distributed`` a variable's array spans every process's devices and this process
can read only its own copies: :func:`local_value` gives one of them (every copy holds the
whole value under a ``DataParallel`` distribution, which the callback checks at the start).

Threading: the training thread, inside ``fit()``'s batch hooks.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from autockpt_core import AutockptError
from autockpt_core.internals_door import MISSING

from . import internals

log = logging.getLogger("autockpt")


def optimizer_step(model: Any) -> int:
    """``model.optimizer.iterations`` as an int, read from the detached state while ``fit()``
    holds it (else from the variable)."""
    optimizer = model.optimizer
    iterations = optimizer.iterations
    state = internals.jax_state(model)
    if state is MISSING:
        _tell_missing_once(model)
        model.jax_state_sync()
    elif state is not None:
        values = state.get("optimizer_variables") or ()
        for variable, value in zip(optimizer.variables, values):
            if variable is iterations:
                return int(local_value(value))
        model.jax_state_sync()  # not found (another optimizer layout): reattach, then read
    return int(local_value(iterations.value))


_told: weakref.WeakSet[Any] = weakref.WeakSet()  # the models a missing name was logged for


def _tell_missing_once(model: Any) -> None:
    if model not in _told:
        _told.add(model)
        names = " or ".join(internals.INTERNALS[key].label for key in ("jax_state", "jax_state_synced"))
        log.warning("autockpt: this Keras has no %s; the state is reattached to read the step at every batch", names)


def global_step(model: Any, backend: str) -> int:
    """The optimizer's step count of a compiled ``model`` (on JAX without a state sync)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise RuntimeError("AutoCheckpoint needs a compiled model (model.compile(optimizer=...)).")
    if backend == "jax":
        return optimizer_step(model)
    return int(optimizer.iterations.numpy())


def local_value(value: Any) -> Any:
    """``value`` itself, or, for a ``jax.Array`` that spans other processes' devices too, its
    copy on this process's first device (a replicated array's whole value).

    Raises :class:`~autockpt_core.AutockptError` for an array that is split over processes
    (this process holds a part only), which the callback does not checkpoint.
    """
    if getattr(value, "is_fully_addressable", True):
        return value
    if not value.sharding.is_fully_replicated:
        raise AutockptError(
            f"AutoCheckpoint reads every variable on process 0, but a variable of shape {value.shape} is "
            f"split over the processes ({value.sharding}). Fix: train with keras.distribution.DataParallel "
            "(variables replicated on every device), or checkpoint model-parallel JAX jobs with Orbax."
        )
    return value.addressable_data(0)
