"""Auto-resume: what a rerun of the same command does before its first training step.

Call order (training thread, every rank):

1. ``load_newest(trainer, driver, storage, verbose)`` in ``on_fit_start``: rank 0 finds the
   newest valid checkpoint (``FitDriver.resume_record``: every rank gets it), loading each
   candidate while its checksum is computed (:mod:`.verified_load`), and every rank loads
   modules and callbacks from it through Lightning's checkpoint connector (rank 0 from what it
   loaded already), so Lightning itself then restores loops, optimizers, schedulers and
   precision state. The callback's own entry reaches it through ``load_state_dict``.
2. ``apply_exact_state(trainer, state, ...)`` in ``on_train_start``: that entry's sampler
   positions and generator states (:func:`autockpt_lightning.resume.restore`), with a
   :class:`~autockpt_core.ResumeNotExactWarning` for whatever cannot be exact.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pickle
import uuid
import warnings
from typing import Any, Callable, Mapping

import lightning.pytorch as pl
import torch

from autockpt_core import AutockptError, CheckpointSession, ResumeNotExactWarning
from autockpt_core.agreed_check import AgreedCheck
from autockpt_core.config import path_of_location
from autockpt_core.fit_driver import FitDriver
from autockpt_core.persist import CheckpointRecord, Storage, location_of
from autockpt_core.persist.fetched_copies import PREFIX, fetch_directory, remove_stale_copies
from autockpt_core.persist.storage import download
from autockpt_core.persist.verified_fetch import FetchWhileVerifying

from . import internals
from . import resume as _resume
from .distributed import LightningRanks, raise_if_any_failed
from .verified_load import LoadWhileVerifying, fusable, serving

CONTINUES_EXACTLY = "continues_exactly"
"""Manifest meta of a final checkpoint: False when Lightning cannot continue from it exactly."""
NOT_EXACT = "not_exact"
"""Manifest meta of an emergency checkpoint Lightning cannot continue from exactly: why (a
resume from it warns with it; it is resumed from all the same: it holds the newest work)."""
EPOCHS_DONE = "epochs_done"
"""Manifest meta: ``trainer.current_epoch`` when the checkpoint was taken, the epochs the fit had
completed (the record's ``epoch`` is the 0-based epoch its step was trained in)."""


def load_newest(
    trainer: pl.Trainer,
    driver: FitDriver,
    storage: Storage,
    verbose: bool,
    storage_options: Mapping[str, Any] | None = None,
    allow_pickle: bool = False,
    sharded: bool = False,
) -> int | None:
    """Restore modules and callbacks from the newest valid checkpoint; returns its step (every rank).

    Rank 0 picks the checkpoint through ``driver.resume_record`` (every rank gets its record; an
    error picking it is raised on every rank); every rank loads it from ``storage`` (``dirpath``'s).
    A checkpoint under a URL (object storage) is first downloaded once per node (:func:`node_copy`).
    An error on any rank (a checkpoint that does not fit the model, an unreadable file) is
    raised on every rank. Nothing is loaded when ``fit()`` got a ``ckpt_path`` or the trainer
    already trained. The file is loaded weights only (:func:`untrusted_load_error` explains a
    refusal), unless ``allow_pickle`` (``Config.allow_pickle``). ``sharded``: every rank wrote
    the checkpoints (a sharded model): every rank then verifies its own files of each candidate
    (:class:`~autockpt_core.agreed_check.AgreedCheck`).
    """
    # Auto-resume route (lightning 2.6). Trainer._run restores modules and callbacks from
    # fit()'s ckpt_path before on_fit_start and loops/optimizers right after it, both from
    # the connector's preloaded `_loaded_checkpoint`. Restoring modules and callbacks here
    # with `_restore_modules_and_callbacks(path)` therefore makes Lightning's own
    # restore_training_state() restore loops, optimizers, schedulers and precision state,
    # and resume_end() report "Restored all states from ... <our file>". A non-empty
    # `_loaded_checkpoint` at this point means the user gave a ckpt_path (argument or
    # trainer.ckpt_path): it wins and nothing is loaded here. Rejected alternatives:
    # setting trainer.ckpt_path in setup() is too late (_run already holds its own
    # ckpt_path); the OnExceptionCheckpoint route makes _parse_ckpt_path print a
    # misleading "ckpt_path=None ... last model of the previous fit" warning on every run
    # and picks by mtime among ModelCheckpoint's last*.ckpt files too.
    # A trainer that already trained in this process (a second fit() call) continues from
    # its in-memory state, which is at least as new as any checkpoint: nothing to load.
    connector = internals.checkpoint_connector(trainer)
    if internals.user_checkpoint_loaded(connector) or trainer.global_step > 0:
        return None
    agreed = AgreedCheck(LightningRanks(trainer), storage) if sharded and trainer.world_size > 1 else None
    if driver.session is None and agreed is not None:
        agreed.follow()  # rank 0's checks of each candidate's files, this rank's share

    def passed_over(record: CheckpointRecord) -> bool:
        return not record.meta.get(CONTINUES_EXACTLY, True) and _more_to_train(trainer, record)

    restore = internals.restore_modules_and_callbacks(connector)
    # The class's signature: a wrapper around the bound method (a profiler's) may hide it.
    takes_weights_only = "weights_only" in inspect.signature(internals.restore_function(connector)).parameters
    # Rank 0 loads each candidate while verifying it (verified_load.py): the file is read once;
    # under a URL it is downloaded once, verified on the way, and loaded from that copy.
    fetches = FetchWhileVerifying(storage) if driver.session is not None else None  # only verifies local files
    loads = None
    if driver.session is not None and takes_weights_only and fusable(trainer, sharded):
        loads = LoadWhileVerifying(
            trainer.strategy, storage, weights_only=not allow_pickle, skip=passed_over, fetches=fetches
        )

    def pick(session: CheckpointSession) -> CheckpointRecord | None:
        check = agreed.check if agreed is not None else loads.check if loads is not None else None
        if check is None and fetches is not None:
            check = fetches.check
        try:
            record = session.resume_record(check=check)
            if record is not None and passed_over(record):
                record = _before_final(session, record, verbose, check)
        finally:
            if agreed is not None:
                agreed.done()
        if record is not None and verbose:
            mirror = session.mirror
            source = f" (copied from the mirror {mirror.location})" if session.copied_from_mirror and mirror else ""
            print(f"autockpt: resuming from step {record.step}: {location_of(storage, record.name)}{source}", flush=True)
        if record is not None and record.meta.get(NOT_EXACT):
            warnings.warn(
                f"autockpt: resuming from step {record.step}, a checkpoint {record.meta[NOT_EXACT]}: the rest "
                "of this run may not be bitwise an uninterrupted one (docs/reliability.md, 'A signal during "
                "validation')",
                ResumeNotExactWarning,
                stacklevel=2,
            )
        return record

    try:
        record = driver.resume_record(pick)
        if record is None:
            return None
        path = location_of(storage, record.name)
        # The manifest's CRC-32 finds torn and corrupted files, not forged ones: whoever can write
        # dirpath (or the mirror) can write a valid record too. So the file is loaded weights only.
        local, copied = node_copy(trainer, path, storage_options, fetches.kept_path(record) if fetches else None)
        if fetches is not None:
            fetches.take(record)  # node 0's copy now: removed below, as `copied`
    finally:
        if fetches is not None:
            fetches.discard()  # a copy not taken: another candidate's, or node_copy failed
    loaded = loads.take(record) if loads is not None else None
    error = None
    try:
        if takes_weights_only:
            try:
                with serving(trainer.strategy, local, loaded):
                    restore(local, weights_only=not allow_pickle)
            except pickle.UnpicklingError as exc:
                raise untrusted_load_error(local, path, exc) from None
        else:  # pragma: no cover - older Lightning, which always unpickles fully
            restore(local)
    except UntrustedCheckpointError as exc:
        error = exc
    except RuntimeError as exc:
        error = _not_this_model(exc, path) if "state_dict" in str(exc) else exc
    except Exception as exc:
        error = exc
    try:
        raise_if_any_failed(trainer, error)  # a rank that cannot read the file must not leave the others waiting
    finally:
        if copied:  # every rank of this node has loaded it (the agreement above is a collective)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local)
    return record.step


def node_copy(
    trainer: pl.Trainer, path: str, storage_options: Mapping[str, Any] | None, fetched: str | None = None
) -> tuple[str, bool]:
    """Collective: a local file holding the checkpoint at ``path`` for every rank, and whether
    it is a temporary copy that this rank must remove once every rank has loaded it.

    A local path is used as it is. A URL (object storage) is downloaded once per node, by the
    node's local rank 0, into the temporary directory, with ``storage_options`` (Lightning would
    open the URL without them); the other ranks of the node wait for it and read that copy. A
    failed download is raised on every rank. ``fetched`` (global rank 0): the copy rank 0
    downloaded while verifying the checkpoint, which node 0 uses instead of a second download.
    """
    if path_of_location(path) is not None:
        return path, False
    token = uuid.uuid4().hex[:12]
    if trainer.world_size > 1:
        token, fetched = trainer.strategy.broadcast((token, fetched), src=0)
    if fetched is not None and trainer.node_rank == 0:
        return fetched, trainer.local_rank == 0
    directory = fetch_directory()
    local = os.path.join(directory, f"{PREFIX}{token}-node{trainer.node_rank}{os.path.splitext(path)[1]}")
    error: BaseException | None = None
    downloads = trainer.local_rank == 0
    if downloads:
        remove_stale_copies(directory)  # left by ranks killed during a download or a load
        try:
            download(path, local, storage_options)
        except Exception as exc:
            error = exc
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local)
    raise_if_any_failed(trainer, error)  # also: the copy is complete before any rank reads it
    return local, downloads


class UntrustedCheckpointError(AutockptError, RuntimeError):
    """A checkpoint holds objects a weights-only load refuses (see :func:`untrusted_load_error`)."""


def untrusted_load_error(local: str, path: str, exc: BaseException) -> UntrustedCheckpointError:
    """The error for a checkpoint whose objects a weights-only load refused: which, and the fixes."""
    find = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    try:
        names = list(find(local)) if find is not None else []
    except Exception:  # noqa: BLE001 - the names only improve the message
        names = []
    what = ", ".join(names) if names else f"objects a weights-only load refuses ({str(exc).splitlines()[-1]})"
    classes = ", ".join(name.rpartition(".")[2] for name in names) or "YourClass"
    return UntrustedCheckpointError(
        f"autockpt: the checkpoint {path} holds {what}. Loading such objects runs code named in the file, "
        "so autockpt loads weights only: anyone who can write dirpath or the mirror could otherwise run "
        f"code here. Fix: if these classes are yours, allow them before fit(): "
        f"torch.serialization.add_safe_globals([{classes}]); or pass allow_pickle=True if you trust everyone "
        "who can write dirpath and the mirror."
    )


def _more_to_train(trainer: pl.Trainer, record: CheckpointRecord) -> bool:
    """Whether this fit's limits go beyond the checkpoint (its step, the epochs it completed;
    checkpoints written without ``EPOCHS_DONE`` recorded that count as their ``epoch``)."""
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    if max_steps is not None and max_steps >= 0 and record.step >= max_steps:
        return False
    done = int(record.meta.get(EPOCHS_DONE, record.epoch or 0))
    return not (max_epochs is not None and max_epochs >= 0 and done >= max_epochs)


def _before_final(
    session: CheckpointSession,
    final: CheckpointRecord,
    verbose: bool,
    check: Callable[[CheckpointRecord], str | None] | None = None,
) -> CheckpointRecord:
    """The checkpoint to continue from when the newest is a final one Lightning cannot continue exactly.

    A final checkpoint taken at an epoch's end holds the finished model, but Lightning does not
    continue bitwise exactly from an epoch's end; a run with more epochs therefore resumes from
    the newest checkpoint before it (and trains those steps again). Without one, it resumes from
    the final checkpoint with a :class:`~autockpt_core.ResumeNotExactWarning`.
    """
    earlier = session.resume_record(before=final, check=check)
    if earlier is None:
        warnings.warn(
            f"autockpt: resuming from the final checkpoint of step {final.step} (an epoch's end) to train "
            "further: Lightning does not continue bitwise exactly from an epoch's end, and no earlier "
            "checkpoint is left (keep_last). Weights, optimizer and step are restored.",
            ResumeNotExactWarning,
            stacklevel=3,
        )
        return final
    if verbose:
        print(
            f"autockpt: training beyond the final checkpoint of step {final.step}: continuing from step "
            f"{earlier.step} instead, from which the run continues bitwise exactly",
            flush=True,
        )
    return earlier


def _not_this_model(exc: RuntimeError, path: str) -> AutockptError:
    """torch's raw ``load_state_dict`` error, said in terms of the checkpoint and the fix."""
    detail = str(exc).strip().splitlines()
    first = " ".join(line.strip() for line in detail[:3])
    error = AutockptError(
        f"autockpt cannot resume from {path}: the checkpoint does not fit this model ({first}). "
        "The model changed since the checkpoint was written. Fix: restore the model definition the "
        "checkpoint was written from, or start fresh with resume=False or another dirpath."
    )
    error.__cause__ = exc
    return error


def apply_exact_state(
    trainer: pl.Trainer, state: dict[str, Any] | None, resumed_from: int | None, check_loaders: bool
) -> Any | None:
    """Apply the restored sampler positions and RNG; warn where the resume is not exact.

    ``check_loaders``: also warn about train loaders that cannot resume mid-epoch (once per
    callback). Returns the warnings filter added to hide Lightning's not-resumable warning
    when every plain loader resumes through a ResumableSampler (the caller removes it when
    training ends), else None.
    """
    if check_loaders:
        problems = _resume.loader_problems(trainer)
        if problems and trainer.is_global_zero:
            warnings.warn(
                "autockpt: a resumed run will not see exactly the data an uninterrupted run sees: "
                + "; ".join(problems) + ".",
                ResumeNotExactWarning,
                stacklevel=2,
            )
    if not state:
        if resumed_from is not None and trainer.is_global_zero:
            warnings.warn(
                f"autockpt: the checkpoint of step {resumed_from} holds no autockpt state "
                "(random generators, sampler positions): it was written by an older autockpt, "
                "so this resume is not bitwise exact.",
                ResumeNotExactWarning,
                stacklevel=2,
            )
        return None
    hidden = None
    if _resume.sampler_covers_plain_loaders(trainer):
        # Every plain train loader resumes through its ResumableSampler: Lightning's warning
        # that such a loader restarts the epoch does not apply (filter removed when training ends).
        warnings.filterwarnings("ignore", message=_resume.LIGHTNING_NOT_RESUMABLE_WARNING)
        hidden = warnings.filters[0]
    problems = _resume.restore(trainer, state)
    if problems:
        warnings.warn(
            f"autockpt: resuming at step {trainer.global_step} is not bitwise exact: " + "; ".join(problems) + ".",
            ResumeNotExactWarning,
            stacklevel=2,
        )
    return hidden
