"""Every private Lightning name the adapter touches, behind one small function each.

Lightning keeps what exact resume needs in private attributes: the train loaders and the data
fetcher of the fit loop, the checkpoint connector (``dump_checkpoint``, the restore of modules
and callbacks), the signal connector's SIGTERM notifier, and a few more (:data:`INTERNALS`).
The adapter reads them only here, through :func:`read`, so a Lightning release that renames or
removes one gives None to the caller, never an ``AttributeError`` in the middle of a save or a
resume. :func:`check_internals` runs at ``setup("fit")``: a missing name the callback cannot
work without (``required``) is an :class:`~autockpt_core.AutockptError` naming it before
anything trains; any other missing name is one
:class:`~autockpt_core.ResumeNotExactWarning` (or, where exactness is not at stake, a log
warning) that says what is off without it, and the callers degrade: no sampler positions, no
carried prefetched batch, no SIGTERM take-over, no SLURM requeue warning.

Checked against Lightning 2.5.1 (the oldest supported release) and 2.6.6. The canaries in
``tests/compat/test_lightning_internals.py`` check every name on the installed release
(``python -m pytest tests/compat``); run them against a new Lightning before raising the
tested range in the README.

Threading: read-only lookups, on the thread of the hook that calls them.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from autockpt_core.internals_door import MISSING, Internal, absent, lookup, report_missing
from autockpt_torch import internals as torch_internals

INTERNALS: dict[str, Internal] = {
    "checkpoint_connector": Internal("Trainer", "_checkpoint_connector", "writing and restoring checkpoints", True),
    "loaded_checkpoint": Internal(
        "_CheckpointConnector", "_loaded_checkpoint", "telling fit()'s ckpt_path from an auto-resume", True
    ),
    "restore_modules_and_callbacks": Internal(
        "_CheckpointConnector", "_restore_modules_and_callbacks", "auto-resume", True
    ),
    "combined_loader": Internal(
        "_FitLoop", "_combined_loader", "the train loaders' sampler positions and the checks of their exactness"
    ),
    "data_fetcher": Internal(
        "_FitLoop", "_data_fetcher", "the batch fetched ahead of an unsized loader and the validation ahead"
    ),
    "ready_batches_reached": Internal(
        "_TrainingEpochLoop", "_num_ready_batches_reached", "deferring a checkpoint from an epoch's last batch"
    ),
    "should_check_val": Internal(
        "_TrainingEpochLoop", "_should_check_val_fx", "deferring a checkpoint from right before validation"
    ),
    "val_loop": Internal(
        "_TrainingEpochLoop", "val_loop", "acting on a signal during validation (it then waits for the next step)",
        exactness=False,
    ),
    "wrapped_sampler": Internal(
        "_DatasetSamplerWrapper", "_sampler", "the check of a shuffling sampler Lightning wraps for DDP"
    ),
    "signal_connector": Internal("Trainer", "_signal_connector", "taking SIGTERM over from Lightning", exactness=False),
    "sigterm_notifier": Internal(
        "_SignalConnector", "_sigterm_notifier_fn", "taking SIGTERM over from Lightning", exactness=False
    ),
    "original_handlers": Internal(
        "_SignalConnector", "_original_handlers", "putting back the signal handlers found at fit()'s start",
        exactness=False,
    ),
    "accelerator_connector": Internal(
        "Trainer", "_accelerator_connector", "the warning about Lightning's SLURM auto-requeue", exactness=False
    ),
    "metadata_filename": Internal(
        "lightning.fabric.utilities.load", "_METADATA_FILENAME", "sharded checkpoints Lightning loads", True
    ),
    "save_distributed_checkpoint": Internal(
        "ModelParallelStrategy", "_save_distributed_checkpoint", "refusing save_distributed_checkpoint=False",
        exactness=False,
    ),
}


def read(obj: Any, key: str) -> Any | None:
    """``obj``'s attribute for ``INTERNALS[key]``; None where this Lightning has no such name."""
    value = lookup(INTERNALS, obj, key)
    return None if value is MISSING else value


def has(obj: Any, key: str) -> bool:
    return lookup(INTERNALS, obj, key) is not MISSING


# -- the adapter's accessors ---------------------------------------------------------------------


def checkpoint_connector(trainer: pl.Trainer) -> Any:
    """The trainer's checkpoint connector (required: :func:`check_internals` refused a fit without it)."""
    return read(trainer, "checkpoint_connector")


def user_checkpoint_loaded(connector: Any) -> bool:
    """fit() got a ``ckpt_path`` (argument or ``trainer.ckpt_path``) and Lightning loaded it."""
    return bool(read(connector, "loaded_checkpoint"))


def restore_modules_and_callbacks(connector: Any) -> Any:
    """The connector's bound ``_restore_modules_and_callbacks(path[, weights_only])``."""
    return read(connector, "restore_modules_and_callbacks")


def restore_function(connector: Any) -> Any:
    """The same method on the connector's class (its signature, past a profiler's wrapper)."""
    return read(type(connector), "restore_modules_and_callbacks")


def combined_loader(trainer: pl.Trainer) -> Any | None:
    """The fit loop's ``CombinedLoader`` of the train loaders (None before ``setup_data``, or missing)."""
    return read(trainer.fit_loop, "combined_loader")


def data_fetcher(trainer: pl.Trainer) -> Any | None:
    """The fit loop's data fetcher (None before ``setup_data``, or missing)."""
    return read(trainer.fit_loop, "data_fetcher")


def at_epochs_last_batch(trainer: pl.Trainer) -> bool | None:
    """The epoch loop has fetched its last batch; None where this Lightning cannot say."""
    reached = read(trainer.fit_loop.epoch_loop, "ready_batches_reached")
    return None if reached is None else bool(reached())


def validation_next(trainer: pl.Trainer, fetcher: Any) -> bool | None:
    """A validation run follows this batch; None where this Lightning cannot say."""
    should_check = read(trainer.fit_loop.epoch_loop, "should_check_val")
    return None if should_check is None else bool(should_check(fetcher))


def validation_loop(trainer: pl.Trainer) -> Any | None:
    """The fit's validation loop (its ``run()`` starts each validation); None where missing."""
    return read(trainer.fit_loop.epoch_loop, "val_loop")


def wrapped_sampler(dataset: Any) -> Any:
    """The sampler a ``DistributedSamplerWrapper``'s dataset wraps; :data:`UNKNOWN` where missing."""
    value = lookup(INTERNALS, dataset, "wrapped_sampler")
    return UNKNOWN if value is MISSING else value


UNKNOWN = object()
"""Returned by :func:`wrapped_sampler` where this Lightning keeps the wrapped sampler elsewhere."""


def signal_connector(trainer: pl.Trainer) -> Any | None:
    return read(trainer, "signal_connector")


def cluster_environment(trainer: pl.Trainer) -> Any | None:
    connector = read(trainer, "accelerator_connector")
    return None if connector is None else getattr(connector, "cluster_environment", None)


def metadata_filename() -> str:
    """The file of a sharded checkpoint that holds everything but the tensors (required with
    ``ModelParallelStrategy``: :func:`check_internals` refused a sharded fit without it)."""
    from lightning.fabric.utilities import load

    return str(read(load, "metadata_filename"))


def saves_distributed_checkpoint(strategy: Any) -> bool | None:
    """``ModelParallelStrategy(save_distributed_checkpoint=...)``; None where this Lightning cannot say."""
    value = read(strategy, "save_distributed_checkpoint")
    return None if value is None else bool(value)


# -- at setup("fit") ------------------------------------------------------------------------------


def missing(trainer: pl.Trainer) -> list[Internal]:
    """The internals this trainer's Lightning lacks, of those that exist before the fit runs
    (the strategy's only for ``ModelParallelStrategy``; the sampler wrapper's is checked where
    it is used)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    holders: list[tuple[Any, tuple[str, ...]]] = [
        (trainer, ("checkpoint_connector", "signal_connector", "accelerator_connector")),
        (trainer.fit_loop, ("combined_loader", "data_fetcher")),
        (trainer.fit_loop.epoch_loop, ("ready_batches_reached", "should_check_val", "val_loop")),
    ]
    connector = read(trainer, "checkpoint_connector")
    if connector is not None:
        holders.append((connector, ("loaded_checkpoint", "restore_modules_and_callbacks")))
    signals = read(trainer, "signal_connector")
    if signals is not None:
        holders.append((signals, ("sigterm_notifier", "original_handlers")))
    if isinstance(trainer.strategy, ModelParallelStrategy):
        from lightning.fabric.utilities import load

        holders += [(trainer.strategy, ("save_distributed_checkpoint",)), (load, ("metadata_filename",))]
    return absent(INTERNALS, holders)


def check_internals(trainer: pl.Trainer) -> None:
    """At ``setup("fit")``: refuse a Lightning without a required internal, naming it; say what
    is off without any other (one warning); then the same for the torch names the checkpoint
    writes use (:func:`autockpt_torch.internals.check_internals`: warnings only)."""
    report_missing(missing(trainer), f"Lightning {pl.__version__}", stacklevel=4)
    torch_internals.check_internals()
