"""``AutoCheckpoint``: the Keras callback that drives a :class:`~autockpt_core.CheckpointSession`.

The callback holds no policy: it maps ``fit()``'s hooks to session calls and copies the
state. Order of calls inside ``fit()`` (TensorFlow and torch trainers, Keras 3):

1. ``on_train_begin``: a new session; ``session.resume_record()``; if a valid checkpoint
   exists, the model's and optimizer's variables are built if needed and assigned, and
   ``model._initial_epoch`` is set (``fit()`` reads it right after this hook); then
   ``session.start(optimizer.iterations)``.
2. ``on_epoch_begin``: remembers the epoch (and puts ``model._initial_epoch`` back).
3. ``on_train_batch_end``: ``session.step_end(optimizer.iterations, loss)``; when the
   decision says so, ``session.save(...)`` copies every variable into the session's reusable
   buffers (the only time the training loop is blocked) and hands the file to the writer
   thread. The first call also does one untimed copy, during the profiler's warm-up, that
   allocates those buffers (and traces TensorFlow's batched read).
4. ``on_epoch_end``: adds ``autockpt_checkpoints``, ``autockpt_interval_steps``,
   ``autockpt_stall_ms`` and ``autockpt_overhead_pct`` to the epoch logs. ``fit()`` passes
   the same dict to every callback and appends its own ``History`` last, so the keys land in
   ``history.history`` (NaN until the value is known, so every list has one entry per epoch).
   A ``History`` passed explicitly must come after ``AutoCheckpoint`` in ``callbacks``.
5. ``on_train_end``: a final checkpoint if training advanced since the newest one
   (``save_on_train_end``), then ``session.finish()`` (waits for the last persist) and the
   summary line when ``verbose``.

Threading: every hook runs on the training thread; the callback is not ``async_safe``, so
Keras calls ``on_train_batch_end`` synchronously between steps and the copy is consistent.
Only the file write, fsync, manifest update and retention run in the session's writer
thread, reading the buffers, never the live variables. A failed write is raised as
:class:`~autockpt_core.CheckpointWriteError` from a later hook (so ``fit()`` stops), and the
previous checkpoint stays the newest valid one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import Any

import keras

from autockpt_core import CheckpointSession, Config, ConfigError, RunSummary, Storage

from .checkpoint_file import FRAMEWORK, SUFFIX, CheckpointInfo, file_metadata, make_snapshot, read_record
from .copying import Copier, copier_for
from .state import assign_state, collect_state, ensure_built

#: Keys added to the epoch logs (and so to ``History``), from ``session.metrics()``.
LOG_KEYS = {
    "autockpt_checkpoints": "autockpt/checkpoints",
    "autockpt_interval_steps": "autockpt/interval_steps",
    "autockpt_stall_ms": "autockpt/stall_ms",
    "autockpt_overhead_pct": "autockpt/overhead_pct",
}

_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(Config))

# Config's defaults, so the signature shows the real values without restating them.
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(Config) if f.default is not dataclasses.MISSING
}


@dataclasses.dataclass(frozen=True)
class CheckpointEvent:
    """One checkpoint this callback took: when, why, and what it cost the training thread."""

    step: int
    epoch: int
    batch: int | None
    next_epoch: int
    reason: str
    interval_steps: int | None
    interval_rule: str | None
    stall_s: float
    nbytes: int


class AutoCheckpoint(keras.callbacks.Callback):
    """Automatic, crash-safe checkpointing for ``model.fit()``; see the module docstring.

    Usage::

        model.fit(x, y, epochs=10, callbacks=[AutoCheckpoint("ckpts", overhead_budget="2%")])
        # rerun the same script: it resumes from the newest valid checkpoint in "ckpts"

    Every keyword mirrors a field of :class:`autockpt_core.Config` (same defaults) and is
    validated here: a bad value raises :class:`~autockpt_core.ConfigError` at construction.
    Alternatively pass a built ``config``; then the keywords that differ from their defaults
    (and ``dirpath``) override it.

    Args:
        dirpath: Directory (or ``file://``/fsspec URL) for checkpoints and the manifest.
        overhead_budget: Largest fraction of training time checkpointing may take (0.02, "2%").
        mtbf: Mean time between failures (seconds or "6h"); enables Young/Daly.
        every_n_steps: Checkpoint exactly every N optimizer steps instead of the policy.
        min_interval / max_interval: Bounds on the time between checkpoints ("30s", "30min").
        keep_last: Number of checkpoints kept; older ones go after a newer one is durable.
        warmup_steps: Steps the profiler ignores (tracing, compilation, allocator warm-up).
        profile_window: Samples per online estimate.
        async_persist: Write files in a background thread (True) or in the training thread.
        resume: Restore the newest valid checkpoint in ``dirpath`` when ``fit()`` starts.
        schedule: "uniform" or "front_loaded" (needs ``mtbf``).
        adaptive: Re-tune the interval when measured overhead drifts.
        verbose: Print the resume message and the end-of-training summary line.
        total_steps: Optimizer steps the whole run is expected to take (front-loaded schedule).
        config: A ready :class:`~autockpt_core.Config`; explicit settings above override it.
        save_on_train_end: Take a final checkpoint when ``fit()`` returns normally and the
            state advanced since the newest checkpoint, so a rerun with more epochs continues
            exactly where this one ended (skipped, with a warning, if the last loss is NaN/inf).
        storage: Replaces the storage ``dirpath`` would select (tests, custom backends).

    Resume: the global step is ``model.optimizer.iterations``. A checkpoint taken at the last
    batch of an epoch resumes at the next epoch. A checkpoint taken mid-epoch resumes at the
    start of that same epoch: the weights, optimizer state and ``iterations`` are the
    checkpoint's, and the epoch is replayed from batch 0 (its first batches are seen twice;
    ``iterations`` keeps counting, so the run takes more steps than an uninterrupted one).
    Exact mid-epoch resume needs a resumable data source and is not done yet. With
    ``shuffle=True`` the resumed epochs see other permutations than an uninterrupted run.

    Attributes (after ``fit()``): ``session`` (the :class:`~autockpt_core.CheckpointSession`),
    ``events`` (a :class:`CheckpointEvent` per checkpoint), ``restored`` (the
    :class:`~autockpt_keras.checkpoint_file.CheckpointInfo` resumed from, or None),
    ``summary`` (the :class:`~autockpt_core.RunSummary`).
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        overhead_budget: float | str = _DEFAULTS["overhead_budget"],
        mtbf: float | str | None = _DEFAULTS["mtbf"],
        every_n_steps: int | None = _DEFAULTS["every_n_steps"],
        min_interval: float | str | None = _DEFAULTS["min_interval"],
        max_interval: float | str | None = _DEFAULTS["max_interval"],
        keep_last: int = _DEFAULTS["keep_last"],
        warmup_steps: int = _DEFAULTS["warmup_steps"],
        profile_window: int = _DEFAULTS["profile_window"],
        async_persist: bool = _DEFAULTS["async_persist"],
        resume: bool = _DEFAULTS["resume"],
        schedule: str = _DEFAULTS["schedule"],
        adaptive: bool = _DEFAULTS["adaptive"],
        verbose: bool = _DEFAULTS["verbose"],
        total_steps: int | None = _DEFAULTS.get("total_steps"),
        config: Config | None = None,
        save_on_train_end: bool = True,
        storage: Storage | None = None,
    ) -> None:
        super().__init__()
        values: dict[str, Any] = {
            "overhead_budget": overhead_budget,
            "mtbf": mtbf,
            "every_n_steps": every_n_steps,
            "min_interval": min_interval,
            "max_interval": max_interval,
            "keep_last": keep_last,
            "warmup_steps": warmup_steps,
            "profile_window": profile_window,
            "async_persist": async_persist,
            "resume": resume,
            "schedule": schedule,
            "adaptive": adaptive,
            "verbose": verbose,
            "total_steps": total_steps,
        }
        self.config: Config = _build_config(dirpath, config, {k: v for k, v in values.items() if k in _DEFAULTS})
        self.save_on_train_end = bool(save_on_train_end)
        self.session: CheckpointSession | None = None
        self.events: list[CheckpointEvent] = []
        self.restored: CheckpointInfo | None = None
        self.summary: RunSummary | None = None
        self._storage = storage
        self._copier: Copier | None = None
        self._epoch = 0
        self._batch: int | None = None
        self._completed_epoch: int | None = None
        self._last_saved_step: int | None = None
        self._last_loss: float | None = None
        self._initial_epoch_to_put_back: tuple[Any] | None = None
        self._buffers_ready = False

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], **overrides: Any) -> "AutoCheckpoint":
        """Build from a YAML/TOML file (``Config.from_file``); ``overrides`` win over the file.

        Overrides that are not Config fields (``save_on_train_end``) go to the constructor.
        """
        config_overrides = {k: v for k, v in overrides.items() if k in _CONFIG_FIELDS}
        extra = {k: v for k, v in overrides.items() if k not in _CONFIG_FIELDS}
        return cls(config=Config.from_file(path, **config_overrides), **extra)

    # -- fit() hooks (training thread) --------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._put_back_initial_epoch()  # left over if an earlier fit() failed before its first epoch
        self.session = CheckpointSession(self.config, framework=FRAMEWORK, suffix=SUFFIX, storage=self._storage)
        self._copier = copier_for(keras.backend.backend())
        self.events = []
        self.restored = None
        self.summary = None
        self._epoch = 0
        self._batch = None
        self._completed_epoch = None
        self._last_saved_step = None
        self._last_loss = None
        self._buffers_ready = False
        record = self.session.resume_record()
        if record is not None:
            arrays, info = read_record(self.session.storage, record)
            ensure_built(self.model)
            assign_state(collect_state(self.model), arrays, order=info.keys)
            del arrays
            self.restored = info
            self._last_saved_step = info.step
            self._initial_epoch_to_put_back = (self.model._initial_epoch,)
            self.model._initial_epoch = info.next_epoch  # read by fit() right after this hook
            if self.config.verbose:
                print(
                    f"autockpt: resumed from {info.path} (step {info.step}); "
                    f"training continues with epoch {info.next_epoch + 1}",
                    flush=True,
                )
        self.session.start(self._global_step())

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._put_back_initial_epoch()
        self._epoch = epoch
        self._batch = None

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        session = self._require_session()
        self._batch = batch
        loss = (logs or {}).get("loss")
        if loss is not None:
            self._last_loss = float(loss)
        step = self._global_step()
        if not self._buffers_ready:  # the train step has run once: every variable exists now
            self._buffers_ready = True
            self._prepare_buffers()
        decision = session.step_end(step, loss=loss)
        if decision.save:
            self._save(step, decision.reason)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._completed_epoch = epoch
        if logs is not None:
            logs.update(self.log_values())

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        session = self._require_session()
        self._put_back_initial_epoch()
        step = self._global_step()
        if self.save_on_train_end and step != self._last_saved_step and self._batch is not None:
            if self._last_loss is not None and not math.isfinite(self._last_loss):
                warnings.warn(
                    f"autockpt: no final checkpoint: the last loss is {self._last_loss}; the newest "
                    f"checkpoint stays step {self._last_saved_step}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            else:
                self._save(step, "end of training")
        self.summary = session.finish()
        if self.config.verbose:
            if self._batch is None and self.restored is not None:
                print(
                    f"autockpt: nothing left to train: the checkpoint at step {self.restored.step} "
                    f"already finished {self.restored.next_epoch} epoch(s); pass a larger epochs= to continue",
                    flush=True,
                )
            else:
                print(self.summary.line(), flush=True)

    # -- helpers ----------------------------------------------------------------------------

    def log_values(self) -> dict[str, float]:
        """The ``autockpt_*`` numbers for the logs (NaN where not measured yet)."""
        metrics = self.session.metrics() if self.session is not None else {}
        return {name: float(metrics.get(source, math.nan)) for name, source in LOG_KEYS.items()}

    def _save(self, step: int, reason: str) -> CheckpointEvent:
        session = self._require_session()
        copier = self._require_copier()
        epoch, batch = self._epoch, self._batch
        steps_per_epoch = self.params.get("steps") if self.params else None
        epoch_done = self._completed_epoch == epoch or (
            batch is not None and steps_per_epoch is not None and batch + 1 >= steps_per_epoch
        )
        next_epoch = epoch + 1 if epoch_done else epoch
        backend = keras.backend.backend()
        model = self.model
        sizes: list[int] = []

        def snapshot(pool: Any) -> Any:
            entries = collect_state(model)
            arrays = copier(entries, pool)
            sizes.append(sum(int(a.nbytes) for a in arrays.values()))
            meta = file_metadata(
                step=step,
                epoch=epoch,
                batch=batch,
                next_epoch=next_epoch,
                backend=backend,
                keras_version=keras.__version__,
                keys=list(arrays),
            )
            return make_snapshot(arrays, meta)

        manifest_meta = {
            "backend": backend,
            "keras_version": keras.__version__,
            "batch": batch,
            "next_epoch": next_epoch,
            "steps_per_epoch": steps_per_epoch,
        }
        decision = session.last_decision
        interval = decision.interval if decision is not None else None
        stall = session.save(step, epoch, snapshot, meta=manifest_meta, reason=reason)
        self._last_saved_step = step
        event = CheckpointEvent(
            step=step,
            epoch=epoch,
            batch=batch,
            next_epoch=next_epoch,
            reason=reason,
            interval_steps=interval.steps if interval is not None else None,
            interval_rule=interval.rule if interval is not None else None,
            stall_s=stall,
            nbytes=sizes[0],
        )
        self.events.append(event)
        return event

    def _prepare_buffers(self) -> None:
        """One copy into the session's buffers at the first step, before any checkpoint.

        It allocates and faults in the reusable buffers (and traces TensorFlow's batched
        read) while the profiler still ignores steps as warm-up, so each checkpoint's stall,
        the first (profiling) one included, is the steady-state copy cost. No persist can be
        reading the buffers yet.
        """
        session = self._require_session()
        pool = session.buffers
        pool.begin_round()
        self._require_copier()(collect_state(self.model), pool)
        pool.end_round()

    def _global_step(self) -> int:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            raise RuntimeError("AutoCheckpoint needs a compiled model (model.compile(optimizer=...)).")
        return int(optimizer.iterations.numpy())

    def _put_back_initial_epoch(self) -> None:
        if self._initial_epoch_to_put_back is not None:
            (self.model._initial_epoch,) = self._initial_epoch_to_put_back
            self._initial_epoch_to_put_back = None

    def _require_copier(self) -> Copier:
        if self._copier is None:
            raise RuntimeError("AutoCheckpoint hooks ran before on_train_begin; use it through model.fit().")
        return self._copier

    def _require_session(self) -> CheckpointSession:
        if self.session is None:
            raise RuntimeError("AutoCheckpoint hooks ran before on_train_begin; use it through model.fit().")
        return self.session


def _build_config(dirpath: str | os.PathLike[str] | None, config: Config | None, values: dict[str, Any]) -> Config:
    """A validated Config: from the keywords, or ``config`` with the keywords that differ from
    their defaults (and ``dirpath``, if given) applied on top."""
    if config is None:
        if dirpath is None:
            raise ConfigError(
                "dirpath", None, "is required", "pass AutoCheckpoint(dirpath='ckpts') or config=Config(...)"
            )
        return Config(dirpath=os.fspath(dirpath), **values)
    if not isinstance(config, Config):
        raise ConfigError(
            "config",
            config,
            "is not an autockpt Config",
            "pass autockpt_core.Config(...) or use AutoCheckpoint.from_config(path)",
        )
    changed = {k: v for k, v in values.items() if v != _DEFAULTS[k]}
    if dirpath is not None:
        changed["dirpath"] = os.fspath(dirpath)
    return config.replace(**changed) if changed else config
