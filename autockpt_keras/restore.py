"""Putting a checkpoint back into a Keras model at the start of ``fit()``.

Call order (``on_train_begin``, training thread, every process, after
``FitDriver.resume_record`` gave every process the record process 0 picked):
:func:`read_checkpoint` (a collective: a process that cannot read the file stops them all),
then :func:`restore_checkpoint` (build, assign the state, hand the resume point to the
:class:`~autockpt_keras.exact_resume.ExactResume`, say where training continues).
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np

from autockpt_core import AutockptError, CheckpointRecord, ResumeNotExactWarning
from autockpt_core.persist import Storage

from .checkpoint_file import CheckpointInfo, read_record
from .exact_resume import ExactResume
from .processes import Processes
from .state import REPLICA, assign_state, collect_state, ensure_built

__all__ = ["read_checkpoint", "restore_checkpoint"]


def read_checkpoint(
    storage: Storage, record: CheckpointRecord, processes: Processes, verified: np.ndarray | None = None
) -> tuple[dict[str, Any], CheckpointInfo]:
    """Collective: every process reads the file process 0 chose (so ``dirpath`` must be one
    they all reach); its arrays and this process's view of its info. ``verified``: the file's
    bytes where this process already read them while verifying (process 0)."""
    result, error = None, None
    try:
        result = read_record(storage, record, verified)
    except Exception as exc:
        error = exc
        if not processes.writes:
            error = AutockptError(
                f"process {processes.index} cannot read {record.name}, the checkpoint process 0 resumes "
                f"from, in {storage.location} ({type(exc).__name__}: {exc}). Fix: a dirpath every process "
                "reaches (a shared file system or an object-store URL)."
            )
    processes.raise_if_any_failed(error)
    assert result is not None
    arrays, info = result
    return arrays, info.for_process(processes.index, processes.count)


def restore_checkpoint(
    model: keras.Model, exact: ExactResume, arrays: dict[str, Any], info: CheckpointInfo, *, say: bool
) -> None:
    """Assign the checkpoint's state to ``model`` (built first) and keep its resume point in
    ``exact``; ``say``: print where training continues. Warns when per-device copies of a
    ``tf.distribute`` run cannot be put back exactly."""
    ensure_built(model)
    exact.prepare_metrics()
    report = assign_state(collect_state(model), arrays, order=info.keys)
    lost = [k for k in report.skipped if REPLICA in k]
    if lost:
        warnings.warn(
            f"autockpt: resuming at step {info.step} is not exact: the checkpoint holds per-device copies "
            f"of {len(lost)} non-trainable variable(s) (BatchNorm statistics, metric totals) from a "
            "tf.distribute run on other devices; here every device starts from the first device's values.",
            ResumeNotExactWarning,
            stacklevel=5,  # the caller of on_train_begin
        )
    point = exact.resume_from(info, arrays, say=say)
    if say:
        where = f"epoch {info.next_epoch + 1}"
        if point is not None and point.batches_done > 0:
            where += f", batch {point.batches_done + 1}: {exact.skip_plan.describe(point.batches_done)}"
        elif point is None and info.batch is not None and info.next_epoch == info.epoch:
            where += " from its first batch: this checkpoint has no batch position"
        print(f"autockpt: resumed from {info.path} (step {info.step}); training continues with {where}", flush=True)


def nothing_left(restored: CheckpointInfo | None) -> str:
    """The message of a resumed ``fit()`` whose checkpoint already finished its epochs."""
    assert restored is not None
    return (
        f"autockpt: nothing left to train: the checkpoint at step {restored.step} "
        f"already finished {restored.next_epoch} epoch(s); pass a larger epochs= to continue"
    )
