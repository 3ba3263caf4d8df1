"""Lightning's own checkpointing beside autockpt: the default ``ModelCheckpoint`` named once, and
every ``trainer.save_checkpoint`` of the fit timed for the summary.

``Trainer(enable_checkpointing=True)``, Lightning's default, adds a ``ModelCheckpoint()`` that
writes a full ``.ckpt`` at every epoch's end: a second copy of the state autockpt already
keeps, written on the training thread, and on a rerun Lightning warns that its directory
"exists and is not empty". autockpt leaves it on (it never touches its files) and warns once
per process, naming ``enable_checkpointing=False``; a ``ModelCheckpoint`` configured for
something autockpt does not do (``monitor=``, ``save_top_k``, ``save_last``, a ``filename``) is
not warned about. :func:`watch_native_checkpointing` runs at ``on_fit_start`` (training thread);
the session's summary puts ``save_checkpoint`` back.
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from autockpt_core import CheckpointSession

_warned = False


def watch_native_checkpointing(trainer: pl.Trainer, session: CheckpointSession | None) -> None:
    """Time the fit's ``trainer.save_checkpoint`` calls (process 0, which has the ``session``)
    and warn once per process when Lightning's default ``ModelCheckpoint`` is on."""
    global _warned
    default = default_model_checkpoint(trainer)
    if session is not None:
        what = "Lightning's ModelCheckpoint" if trainer.checkpoint_callbacks else "trainer.save_checkpoint"
        session.ledger.others.watch(trainer, saves=("save_checkpoint",), what=what)
    if default is None or _warned or not trainer.is_global_zero:
        return
    _warned = True
    warnings.warn(
        "autockpt: Lightning's default ModelCheckpoint is on too (Trainer(enable_checkpointing=True)): it writes "
        "a second, full .ckpt at every epoch's end on the training thread (its cost is in autockpt's summary "
        "line) and warns on reruns that its directory is not empty. Pass Trainer(enable_checkpointing=False) to "
        "keep only autockpt's checkpoints; a ModelCheckpoint you configure (monitor=..., save_top_k=...) works "
        "beside autockpt and is not warned about",
        UserWarning,
        stacklevel=2,
    )


def default_model_checkpoint(trainer: pl.Trainer) -> ModelCheckpoint | None:
    """The trainer's ``ModelCheckpoint`` if it is the only one and has Lightning's default
    settings (what ``enable_checkpointing=True`` adds); None otherwise."""
    found = trainer.checkpoint_callbacks
    if len(found) != 1 or type(found[0]) is not ModelCheckpoint:
        return None
    callback = found[0]
    plain = ModelCheckpoint()
    same = (
        callback.state_key == plain.state_key
        and callback.save_top_k == plain.save_top_k
        and not callback.save_last
        and callback.filename is None
        and not callback.save_weights_only
    )
    return callback if same else None
