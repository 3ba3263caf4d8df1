"""The Keras methods the study compares, where they need code of their own, and the probe that
sees each step: the ``AutoCheckpoint`` of a method, Orbax's newest step directory, a
``tf.train.CheckpointManager`` and the callback that saves it every N steps, the step of a
``ModelCheckpoint`` file, why a method cannot run here, and the callback placed last that
reports every trained step. Used by :mod:`.keras_study` (training thread).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "NEVER", "h5_step", "iterations", "make_autockpt", "make_probe", "make_tf_saver", "orbax_newest", "skip_reason",
    "tf_manager",
]  # fmt: skip

NEVER = 10**9  # a save frequency a restoring run never reaches


def skip_reason(name: str, backend: str) -> str | None:
    if name == "tf-manager" and backend != "tensorflow":
        return f"tf.train.CheckpointManager needs the TensorFlow backend (KERAS_BACKEND={backend})"
    if name == "orbax":
        try:
            import orbax.checkpoint  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - ImportError, or a broken jax install
            return f"orbax-checkpoint is not importable ({type(exc).__name__}: {exc})"
    return None


def iterations(model: Any) -> int:
    return int(model.optimizer.iterations.numpy())


def orbax_newest(d: Path) -> Path | None:
    return max((p for p in d.iterdir() if p.name.isdigit() and p.is_dir()), key=lambda p: int(p.name), default=None)


def tf_manager(model: Any, d: Path) -> tuple[Any, Any]:
    import tensorflow as tf

    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    return checkpoint, tf.train.CheckpointManager(checkpoint, str(d), max_to_keep=2)


def make_tf_saver(model: Any, manager: Any, every: int) -> Any:
    import keras

    class CheckpointManagerSaver(keras.callbacks.Callback):
        """``manager.save(checkpoint_number=step)`` every ``every`` global steps."""

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step = iterations(model)
            if step % every == 0:
                manager.save(checkpoint_number=step)

    return CheckpointManagerSaver()


def h5_step(path: Path, spe: int) -> int:
    """Global step of ``ckpt-eEEEE-bBBBBB.*`` (epoch and batch 1-based, as ModelCheckpoint formats them)."""
    stem = path.name.split(".")[0]
    _, e, b = stem.split("-")
    return (int(e[1:]) - 1) * spe + int(b[1:])


def make_autockpt(method: dict[str, Any], directory: Path, *, resume: bool, saves: bool = True, signals: bool = False) -> Any:
    """autockpt as the study runs it; ``signals``: listen for the default signals (goodput
    ``--notice``), else none."""
    from autockpt_keras import AutoCheckpoint

    if method.get("user_defaults"):  # examples/process_fixed_costs.py: what a user gets with no argument
        return AutoCheckpoint(str(directory))
    kwargs: dict[str, Any] = {"keep_last": 2, "resume": resume, "verbose": False, "save_on_train_end": False}
    if not signals:
        kwargs["signals"] = ()
    if not saves:
        kwargs["every_n_steps"] = NEVER
    elif method["name"] in ("autockpt", "autockpt-ab"):
        kwargs["every_n_steps"] = int(method["every"])
    else:
        kwargs["overhead_budget"] = method["budget"]
        if method.get("mtbf_s") is not None:
            kwargs["mtbf"] = method["mtbf_s"]
    return AutoCheckpoint(str(directory), **kwargs)


def make_probe(model: Any, spe: int, on_step: Callable[[int, int], None], on_begin: Callable[[int], None] | None = None) -> Any:
    """The callback placed last: ``on_step(global_step, data_position)`` after every trained step.

    A batch the global step did not advance on (autockpt drawing the batches a resumed epoch
    had already trained) is not a step. ``position()``: the data position of the batch in
    progress, also inside other callbacks' hooks (this one's begin hooks run before them).
    """
    import keras

    class Probe(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.epoch, self.batch, self.last = 0, -1, -1

        def position(self) -> int:
            return self.epoch * spe + self.batch + 1

        def on_train_begin(self, logs: Any = None) -> None:
            self.last = iterations(model)
            if on_begin is not None:
                on_begin(self.last)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch, self.batch = epoch, -1

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.batch = batch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step = iterations(model)
            if step == self.last:
                return
            self.last = step
            on_step(step, self.position())

    return Probe()
