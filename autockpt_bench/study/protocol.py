"""How ``autockpt compare`` and ``autockpt goodput`` talk to their framework workers.

Every measurement runs in a fresh interpreter (frameworks are imported only there, and each
peak-memory figure belongs to one configuration)::

    python -m autockpt_bench.workers.lightning_study CASE --spec SPEC.json
    python -m autockpt_bench.workers.keras_study     CASE --spec SPEC.json

``SPEC.json`` (written by :func:`write_spec`) holds ``workload`` (:meth:`Workload.to_json`),
``method`` (a :data:`Method` dict), ``dir`` (checkpoint directory), ``steps`` (global steps to
train in all), ``warmup`` (steps excluded from step-time figures), ``threads`` (intra-op
threads; 0 = framework default), ``keras_backend`` (Keras worker), ``out`` (result JSON path),
``started_at`` (``time.time()`` when the parent started the process), and per case ``reference``
(``train`` writes it, ``restore`` compares with it) or ``log`` (``goodput``'s event log):

``train``
    Train ``steps`` global steps from scratch (fresh ``dir``) with the method. Data: one epoch
    is ``make_data(workload, workload.steps_per_epoch)`` (:func:`~.workloads.make_data`) in
    order, no shuffle, repeated for as many epochs as ``steps`` needs (Lightning: a torchdata
    ``StatefulDataLoader``; Keras: the numpy arrays with ``shuffle=False``). After step ``steps``: wait for the method's
    in-flight asynchronous writes, write the final trainable weights to ``reference`` (``.npz``,
    one array per variable in a stable order: ``w0000``, ``w0001``, ...), write the result,
    then ``os._exit(0)`` — like a crash right after the last write, so no method takes an
    end-of-training checkpoint and Keras ``BackupAndRestore`` keeps its backup. Result keys:
    ``framework, workload, method (the name), params (trainable, == param_count), state_bytes
    (bytes of every model + optimizer variable), steps, warmup, step_s (mean wall time per step
    over steps warmup+1..steps, checkpoints included), step_s_median (median single-step time,
    same window), checkpoint_steps (global steps after which a checkpoint was taken), blocked_s
    (per checkpoint: training-thread seconds spent in the method's hooks for it, waits for an
    overlapped copy included), save_s (per checkpoint: start of the save to the file being
    complete; the same as blocked_s for synchronous methods; ``null`` where not observable),
    checkpoint_bytes (bytes on disk of the newest checkpoint: its file or directory, manifest
    excluded), format (e.g. ".ckpt", ".weights.h5", "orbax dir"), peak_rss_bytes (VmHWM),
    threads, hook_s_median (median seconds in the method's hooks over steps without a
    checkpoint: the hooks' cost in every step; ``null`` for no checkpointing)``. autockpt's
    runs add ``reported_overhead``, ``reported_band`` and ``final_interval_steps`` (the
    interval in force at the end); ``autockpt-ab`` adds ``ab_block`` and the figures of
    :func:`~.in_process_ab.ab_figures` (``ab_overhead``, ``ab_noise``, ``ab_cycles``,
    ``ab_meter_view``, ``ab_reference_spread``, ``ab_spill_steps``, ``ab_blocks``, ``ab_excluded``).

``restore``
    A new process resumes from the newest checkpoint the ``train`` run left in ``dir`` the way
    that method's users resume (Lightning ``ckpt_path``, Keras ``load_weights``/``load_model``
    + ``fit(initial_epoch=...)``, ``BackupAndRestore``, orbax restore, TF ``CheckpointManager``
    restore, autockpt's auto-resume) and trains on to global step ``steps`` (a method that
    resumes at an epoch boundary replays that epoch: it ends later than ``steps``; then the
    comparison is at its end). Result keys: ``framework, workload, method, restore_s (time.time() at the end of
    the first trained step - started_at), imports_s (from started_at until the framework's and the
    method's packages are imported), load_s (seconds inside the load itself), skip_s (seconds drawing
    the batches of the resumed epoch already trained, without training on them; None where nothing is
    drawn: Lightning's StatefulDataLoader and the natives that replay the epoch), resumed_step,
    final_step, max_abs_diff (largest |w - reference|), exact (max_abs_diff == 0)``.

``goodput``
    Train the fixed job ``steps`` (= epochs × steps_per_epoch) in ``dir``, resuming the way the
    method's users would if ``dir`` holds a checkpoint; may be SIGKILLed at any moment. Appends
    one JSON object per line to ``log`` (flushed after each): ``{"event": "start", "t"}`` at
    interpreter start, ``{"event": "resumed", "step", "t"}`` once (0 for a fresh start),
    ``{"event": "step", "step", "t"}`` after every trained step, ``{"event": "checkpoint",
    "step", "t", "blocked_s"}`` per checkpoint, and ``{"event": "done", "step", "t",
    "persist_s"}`` when the job is complete (``persist_s``: the method's measured background
    persist time, ``null`` for synchronous methods). Exits 0 when done. The Keras worker
    exits at the last step's end unless the spec sets ``finish_fit`` (then ``fit()`` ends with
    its end-of-training hooks, "done" comes after them and the process exits as a user's
    does); the Lightning worker's ``fit()`` always ends so.

``t`` is always ``time.time()``. Result JSON is written with :func:`write_json`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .workloads import Workload

#: A method: ``{"name": ..., plus its parameters}``. Names (compare):
#:   both: ``none``; ``autockpt`` (``every``: every_n_steps); ``autockpt-budget`` (``budget``);
#:         ``autockpt-ab`` (``every``, ``block``, ``budget``: train only, the in-process A/B of
#:         :mod:`.in_process_ab` at the interval the ``budget`` run chose)
#:   Lightning: ``modelcheckpoint`` (``every``), ``async`` (ModelCheckpoint + AsyncCheckpointIO, ``every``)
#:   Keras: ``modelcheckpoint-h5`` (``.weights.h5``), ``modelcheckpoint-keras`` (``.keras``),
#:          ``backup-restore``, ``orbax`` (OrbaxCheckpoint, save_on_background), ``tf-manager``
#:          (tf.train.CheckpointManager); all with ``every``.
#: Goodput adds ``every-epoch`` (the framework's native per-epoch checkpointing resumed its way),
#: ``native-every-n`` (``every``), ``autockpt-mtbf`` (``budget``, ``mtbf_s``).
Method = dict[str, Any]

WORKERS = {
    "lightning": "autockpt_bench.workers.lightning_study",
    "keras": "autockpt_bench.workers.keras_study",
}

LIGHTNING_METHODS = ("none", "autockpt", "modelcheckpoint", "async")
KERAS_METHODS = ("none", "autockpt", "modelcheckpoint-h5", "modelcheckpoint-keras", "backup-restore", "orbax", "tf-manager")
#: The framework's native synchronous ModelCheckpoint, the reference of the blocked-time target.
NATIVE_SYNC = {"lightning": "modelcheckpoint", "keras": "modelcheckpoint-h5"}


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` atomically (temp file + rename): a reader sees the old file or the new one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as JSON atomically (:func:`write_text`)."""
    write_text(path, json.dumps(data, indent=1))


def write_spec(path: str | os.PathLike[str], workload: Workload, method: dict[str, Any], **fields: Any) -> None:
    write_json(path, {"workload": workload.to_json(), "method": method, **fields})


def read_spec(path: str | os.PathLike[str]) -> tuple[Workload, dict[str, Any], dict[str, Any]]:
    """``(workload, method, spec)`` from a spec file."""
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    return Workload.from_json(spec["workload"]), dict(spec["method"]), spec


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events a goodput worker logged; a torn last line (SIGKILL mid-write) is dropped."""
    out = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class EventLog:
    """Append-only JSON-lines log for goodput workers (one line per event, flushed)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the process

    def write(self, event: str, **fields: Any) -> None:
        import time

        self._file.write(json.dumps({"event": event, "t": fields.pop("t", time.time()), **fields}) + "\n")
        self._file.flush()
