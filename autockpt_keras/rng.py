"""Capture and restore the global random generators a Keras training process draws from.

On top of :mod:`autockpt_core.rng` (Python ``random``, numpy's global generator) and, on the
torch backend or whenever torch is imported (a torch ``DataLoader`` input on TensorFlow or
JAX draws its order from torch's generator), :mod:`autockpt_torch.rng` (torch CPU and
initialized CUDA generators), this adds the generators only Keras and TensorFlow have:

- ``keras_seed``: the state of Keras' global ``SeedGenerator``, which ``keras.random.*``
  draws from when no ``seed`` is passed (layers such as ``Dropout`` own their
  ``SeedGenerator``; those are model variables and live in the checkpoint's tensors).
  Restoring creates it when the resumed process has none yet.
- ``tf_global``: TensorFlow's global ``tf.random.Generator``, if the process created one
  (``tf.random.get_global_generator()``). Capture never creates it.

Not covered (stateful TensorFlow ops such as ``tf.random.uniform`` without a generator keep
their state inside op kernels; user-created generator objects): see ``docs/reliability.md``.

Everything is plain JSON, so it goes into the safetensors header. Call order and threading:
:func:`capture` and :func:`restore` run on the training thread, between steps, at matching
points of the original and the resumed run (:mod:`autockpt_keras.exact_resume` says which).
"""

from __future__ import annotations

import sys
from typing import Any, Iterable

from autockpt_core import rng as core_rng

from . import internals

__all__ = ["capture", "restore"]


def capture_shared() -> dict[str, Any]:
    """Python's, numpy's and (when torch is imported) torch's generators, as plain JSON: the
    ones a data pipeline draws from; comparable with ``==``."""
    if "torch" in sys.modules:  # the torch backend, or a torch DataLoader input on any backend
        from autockpt_torch import rng as torch_rng

        return torch_rng.capture_rng()
    return core_rng.capture_rng()


def restore_shared(state: dict[str, Any]) -> list[str]:
    """Set Python's, numpy's and (in ``state``) torch's generators to ``state`` (from
    :func:`capture_shared` or :func:`capture`); returns what could not be restored."""
    if "torch" not in state:
        core_rng.restore_rng(state)
        return []
    try:
        from autockpt_torch import rng as torch_rng
    except ImportError:
        core_rng.restore_rng(state)
        return ["the checkpoint holds torch's generator state, but torch is not installed"]
    return torch_rng.restore_rng(state)


def capture(backend: str) -> dict[str, Any]:
    """The state of every global generator of this process, as plain JSON."""
    state = capture_shared()
    keras_seed = _keras_seed_state()
    if keras_seed is not None:
        state["keras_seed"] = keras_seed
    tf_global = _tf_global_state()
    if tf_global is not None:
        state["tf_global"] = tf_global
    return state


def restore(state: dict[str, Any], backend: str, keep: Iterable[str] = ()) -> list[str]:
    """Set the generators to ``state`` (from :func:`capture`); returns what could not be restored.

    ``keep``: generators to leave as they are (``"python"``, ``"numpy"``, ``"torch"``: its CPU
    generator). The Keras global
    ``SeedGenerator`` is restored before Python's generator, because creating it draws its
    seed from Python's ``random``.
    """
    kept = set(keep) & ({"python", "numpy", "torch"} if "torch" in state else {"python", "numpy"})
    if kept:
        current = capture_shared()
        state = {**state, **{name: current[name] for name in kept if name in current}}
    problems: list[str] = []
    if "keras_seed" in state:
        _restore_keras_seed(state["keras_seed"])
    problems.extend(restore_shared(state))
    if "tf_global" in state:
        problem = _restore_tf_global(state["tf_global"])
        if problem:
            problems.append(problem)
    return problems


# -- Keras global SeedGenerator --------------------------------------------------------------------


def _keras_seed_state() -> list[int] | None:
    """The global SeedGenerator's state; None where there is none (or this Keras has it elsewhere:
    ``check_internals`` named that)."""
    seed_generator = internals.module("keras.src.random.seed_generator")
    get_global = internals.read(internals.module("keras.src.backend.common.global_state"), "global_state")
    if seed_generator is None or get_global is None:
        return None
    # the attribute's name: a constant since Keras 3.6, the same string before it
    gen = get_global(getattr(seed_generator, "GLOBAL_SEED_GENERATOR", "global_seed_generator"))
    if gen is None:
        return None
    return [int(v) for v in _to_numpy(gen.state.value).reshape(-1)]


def _restore_keras_seed(values: list[int]) -> None:
    import numpy as np

    global_seed_generator = internals.read(internals.module("keras.src.random.seed_generator"), "seed_generator")
    if global_seed_generator is None:
        return
    gen = global_seed_generator()  # created (drawing from Python's random) if absent
    current = _to_numpy(gen.state.value)
    gen.state.assign(np.asarray(values, dtype=current.dtype).reshape(current.shape))


def _to_numpy(value: Any) -> Any:
    import keras

    from .jax_state import local_value

    return keras.ops.convert_to_numpy(local_value(value))  # jax.distributed: this process's copy


# -- TensorFlow's global tf.random.Generator -------------------------------------------------------


def _tf_global_state() -> dict[str, Any] | None:
    if "tensorflow" not in sys.modules:
        return None
    gen = internals.read(internals.module("tensorflow.python.ops.stateful_random_ops"), "tf_global_generator")
    if gen is None:
        return None
    return {"algorithm": int(gen.algorithm), "state": [int(v) for v in gen.state.numpy().reshape(-1)]}


def _restore_tf_global(saved: dict[str, Any]) -> str | None:
    try:
        import tensorflow as tf
    except ImportError:
        return "the checkpoint holds TensorFlow's global generator state, but TensorFlow is not installed"
    gen = tf.random.get_global_generator()
    if int(gen.algorithm) != int(saved["algorithm"]):
        return (
            f"TensorFlow's global generator uses algorithm {int(gen.algorithm)}, the checkpoint's "
            f"{saved['algorithm']}"
        )
    gen.reset(tf.constant(saved["state"], dtype=gen.state.dtype))
    return None
