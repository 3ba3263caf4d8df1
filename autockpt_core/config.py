"""The one validated object that holds everything a user sets.

Build it from keyword arguments (``Config(dirpath="ckpts", overhead_budget=0.02)``), a dict
(``Config.from_dict``) or a YAML/TOML file (``Config.from_file``). Every field is validated
at construction; a bad value raises :class:`~autockpt_core.errors.ConfigError` naming the
field, the value and the fix. Human units are accepted: ``overhead_budget="2%"``,
``mtbf="6h"``, ``min_interval="30s"``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from pathlib import Path
from typing import Any, Mapping

import tomllib

from .config_hints import unknown_setting, warn_ignored_with_every_n_steps
from .config_locations import check_dirpath, check_mirror, check_storage_options, path_of_location
from .cloud_notice import parse_notice
from .deadline import resolve as resolve_deadline
from .errors import ConfigError
from .preemption import DEFAULT_SIGNALS, ON_PREEMPT, signal_names
from .units import parse_duration, parse_fraction

SCHEDULES = ("uniform", "front_loaded")
SNAPSHOT_MODES = ("auto", "sync", "overlap", "device")
"""URL schemes of the local filesystem: a ``dirpath`` or ``mirror`` with one is a local
directory (``LocalStorage``: fsync, rename, lock), not fsspec's local backend, which never fsyncs."""
PERSIST_MODES = ("auto", "thread", "process")
"""``persist_mode`` values; see :mod:`autockpt_core.persist.persist_mode`."""


@dataclasses.dataclass(frozen=True)
class Config:
    """User settings for automatic checkpointing.

    Attributes:
        dirpath: Directory, ``file://``/``local://`` URL or fsspec URL (``s3://bucket/run``) the
            checkpoints and the manifest go to.
        overhead_budget: Largest fraction of training time checkpointing may cost (0.02 = 2%).
        mtbf: Mean time between failures in seconds (or "6h"); enables Young/Daly.
        every_n_steps: Fixed interval in optimizer steps; replaces the policy (so it cannot be
            combined with ``min_interval``/``max_interval``).
        min_interval: Never checkpoint more often than this (seconds or "30s").
        max_interval: Never let more than this pass without a checkpoint (seconds or "30min").
        keep_last: How many checkpoints to keep; older ones are deleted only after a newer one
            is durable.
        warmup_steps: Steps ignored by the profiler (compilation, caches, allocator warm-up).
        profile_window: Number of recent samples each online estimate is computed from.
        async_persist: Persist in a background thread (True) or on the training thread.
        resume: Resume automatically from the newest valid checkpoint in ``dirpath``.
        schedule: "uniform" or "front_loaded" (denser checkpoints early; needs ``mtbf``).
        adaptive: Re-tune the interval at run time when measured overhead drifts.
        verbose: Print the end-of-training summary line.
        total_steps: Optimizer steps the whole run is expected to take. Optional; the
            front-loaded schedule weighs progress over this horizon (without it, the horizon
            is where the fitted loss curve has made 99% of its decrease).
        signals: Signals that request an emergency checkpoint at the next step boundary
            (names such as "SIGTERM", "USR1"); empty turns preemption handling off. Default:
            SIGTERM, SIGUSR1 and SIGINT (Ctrl-C). See ``docs/reliability.md``.
        on_preempt: After the emergency checkpoint is durable: "exit" (the run ends with exit
            status 128 + signal number) or "continue" training (not for SIGINT, which always
            stops: status 130).
        snapshot_mode: Where the snapshot copy runs (torch-based adapters): "sync" (on the
            training thread, done when the hook returns), "overlap" (during the next step's
            forward/backward, on a helper thread or a CUDA stream; the next optimizer step
            waits for it), "device" (CUDA: into a reserved GPU buffer, then drained to host
            in the background) or "auto" (measured: the modes that fit the state, "sync" and
            "overlap", plus "device" when it fits in free GPU memory, are tried in turn on the
            first checkpoints and the one with the lowest measured cost (blocked time, waits
            and the slowdown of the steps around it, the latter only where it exceeds the
            steps' own noise) is kept; another mode must save 10% of sync's blocked time;
            tried again when the iteration time or the state size drifts by 30%; the choice
            and its figures are logged). See ``docs/benchmarks.md``.
        persist_mode: Where the background persist runs: "thread" (a writer thread in the
            training process), "process" (a separate, lower-priority process that reads the
            snapshot from shared memory, so the persist never holds the training's GIL; local
            directories on Linux) or "auto" ("process" where possible unless CUDA is available,
            whose buffers are pinned instead; the choice is logged). See ``docs/benchmarks.md``.
        storage_options: Options for the fsspec filesystem of a URL ``dirpath`` or ``mirror``
            (``s3://``, ``gs://``, ...), passed to ``fsspec.core.url_to_fs``: e.g.
            ``endpoint_url``, ``key``/``secret``, ``client_kwargs``. Only with a URL. See
            ``docs/reliability.md``, "Object storage".
        mirror: A second tier (``s3://bucket/run``, any fsspec URL, or a directory) that every
            checkpoint committed in ``dirpath`` is copied to in the background, newest first;
            ``dirpath`` is then the fast, node-local tier. A resume takes the newest valid
            checkpoint of either tier (a fresh node has only the mirror's). See
            ``docs/reliability.md``, "A local fast tier with a mirror".
        mirror_keep_last: How many checkpoints the mirror keeps (default: ``keep_last``).
        mirror_max_outage: Time without a successful upload (seconds or "30min") after which a
            failed upload stops training with ``MirrorWriteError``. Each failure before is a
            ``RuntimeWarning`` (with the count and the age of the mirror's newest upload), and
            the upload is tried again after 1, 2, 4, ... seconds (at most 60), with the newest
            checkpoint committed by then. Default "30min": what a node lost during an outage
            costs is the work since the mirror's newest upload (``docs/reliability.md``).
        mirror_max_failures: Also stop after this many failed uploads in a row. Default None
            (only ``mirror_max_outage``).
        mirror_stall_timeout: An upload that writes nothing for this long (seconds or "2min")
            is a failed upload: warned, retried and counted as one (a hung mount, an endpoint
            that went silent). Default "2min"; keep it above the time one block of the upload
            takes (s3fs: 50 MB parts).
        mirror_preempt_wait: How long an emergency checkpoint (preemption) waits for the mirror
            once it is committed in ``dirpath`` (seconds or "60s"); an older upload still running
            is abandoned first, so this one goes next. The run exits with 128 + signal whether
            the upload finished or not; the message says which tier holds what. Default None:
            what is left of ``grace_period`` after the local commit, less 2 s to exit.
        grace_period: Seconds from a preemption signal to the scheduler's SIGKILL (or "30s"):
            Kubernetes' and GCE's 30 s, Slurm's ``--signal=TERM@N`` N. The mirror's wait in an
            emergency fits inside it, the message says how much of it the commit took, and
            autockpt warns once when a measured checkpoint (stall plus persist) would not fit.
            Default "30s".
        deadline: When the job ends (a Slurm time limit, a reserved slot): a duration from the
            process start ("3h50m"), an ISO wall time, "slurm" (Slurm's end time where the
            environment gives it; the default) or None. The emergency checkpoint starts early
            enough to be durable before it; the run then exits 143 (docs/reliability.md).
        preemption_notice: Where a spot or preemptible VM's end is announced: "aws", "gce",
            "azure" (each optionally with a base URL: "aws:http://127.0.0.1:8080"), or a URL that
            answers 200 with a body on a notice; None (default): none is read. A notice is
            taken like a SIGTERM (docs/reliability.md).
        notice_poll_interval: Seconds between two looks at ``preemption_notice`` (or "5s").
        mirror_takeover: Take a URL mirror's claim from a run that still renews it (that
            run stops uploading at its next heartbeat, with ``MirrorWriteError``). Off by
            default: a live claim refuses the second run, naming the holder. For a job that
            replaces a hung one; a local mirror directory's lock ends only with its process.
        allow_pickle: Lightning: load checkpoints with full unpickling, which runs code named
            in the file. Off by default: a resume loads weights only (tensors, numbers, strings
            and containers, and the classes registered with ``torch.serialization.add_safe_globals``),
            so whoever can write ``dirpath`` or the mirror cannot run code on the training
            nodes. Turn it on only if you trust everyone who can. Keras checkpoints hold no
            pickles (safetensors and JSON). See ``docs/reliability.md``, "Trust".
        status_file: Keep ``dirpath/autockpt-status.json`` current (a local ``dirpath``): the
            state, the step, the last durable step, the work at risk and what an emergency
            checkpoint takes, for a scheduler (``autockpt status DIR``). Default True.
        log_metrics: Where autockpt's numbers (checkpoints, interval, stall, overhead) go.
            None (default): each framework's quiet place: Lightning sends them to the trainer's
            loggers (not the progress bar); Keras adds nothing to the epoch logs, which its
            progress bar prints whole (``AutoCheckpoint.log_values()`` gives them). True: Keras
            adds the ``autockpt_*`` keys to each epoch's logs (``History``, ``CSVLogger``,
            ``TensorBoard``, and the progress bar). False: neither.
    """

    dirpath: str
    overhead_budget: float = 0.02
    mtbf: float | None = None
    every_n_steps: int | None = None
    min_interval: float | None = None
    max_interval: float | None = None
    keep_last: int = 3
    warmup_steps: int = 5
    profile_window: int = 50
    async_persist: bool = True
    resume: bool = True
    schedule: str = "uniform"
    adaptive: bool = True
    verbose: bool = True
    total_steps: int | None = None
    signals: tuple[str, ...] = DEFAULT_SIGNALS
    on_preempt: str = "exit"
    snapshot_mode: str = "auto"
    persist_mode: str = "auto"
    storage_options: Mapping[str, Any] | None = None
    mirror: str | None = None
    mirror_keep_last: int | None = None
    mirror_max_failures: int | None = None
    mirror_max_outage: float = 1800.0
    mirror_stall_timeout: float = 120.0
    mirror_preempt_wait: float | None = None
    mirror_takeover: bool = False
    allow_pickle: bool = False
    status_file: bool = True
    log_metrics: bool | None = None
    grace_period: float = 30.0
    deadline: Any = "slurm"
    preemption_notice: str | None = None
    notice_poll_interval: float = 5.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "dirpath", check_dirpath(self.dirpath))
        set_(self, "mirror", check_mirror(self.mirror, self.dirpath))
        set_(self, "storage_options", check_storage_options(self.storage_options, self.dirpath, self.mirror))
        set_(self, "overhead_budget", _check_budget(self.overhead_budget))
        set_(self, "mtbf", _check_optional_duration("mtbf", self.mtbf, example="'6h'"))
        set_(self, "every_n_steps", _check_optional_positive_int("every_n_steps", self.every_n_steps))
        set_(self, "total_steps", _check_optional_positive_int("total_steps", self.total_steps))
        set_(self, "min_interval", _check_optional_duration("min_interval", self.min_interval, "'30s'"))
        set_(self, "max_interval", _check_optional_duration("max_interval", self.max_interval, "'30min'"))
        if (
            self.min_interval is not None
            and self.max_interval is not None
            and self.min_interval > self.max_interval
        ):
            raise ConfigError(
                "min_interval",
                self.min_interval,
                f"is larger than max_interval={self.max_interval!r}",
                "make min_interval <= max_interval, or drop one of them",
            )
        if self.every_n_steps is not None and (self.min_interval is not None or self.max_interval is not None):
            bounds = {"min_interval": self.min_interval, "max_interval": self.max_interval}
            given = " and ".join(f"{name}={value!r}" for name, value in bounds.items() if value is not None)
            raise ConfigError(
                "every_n_steps",
                self.every_n_steps,
                f"fixes the interval, so {given} would be ignored",
                "drop every_n_steps to let the policy choose within min_interval/max_interval, "
                "or drop min_interval and max_interval to checkpoint every_n_steps",
            )
        set_(self, "keep_last", _check_int("keep_last", self.keep_last, minimum=1))
        set_(self, "mirror_keep_last", _check_optional_positive_int("mirror_keep_last", self.mirror_keep_last))
        if self.mirror_keep_last is not None and self.mirror is None:
            raise ConfigError(
                "mirror_keep_last", self.mirror_keep_last, "is the mirror's retention, but no mirror is set",
                "set mirror='s3://bucket/run' (or another URL or directory), or drop mirror_keep_last",
            )
        set_(self, "mirror_max_failures", _check_optional_positive_int("mirror_max_failures", self.mirror_max_failures))
        set_(self, "mirror_preempt_wait", _check_optional_duration("mirror_preempt_wait", self.mirror_preempt_wait, "'60s'"))
        durations = (("mirror_max_outage", "'30min'"), ("mirror_stall_timeout", "'2min'"), ("grace_period", "'30s'"),
                     ("notice_poll_interval", "'5s'"))
        for name, example in durations:
            set_(self, name, _check_optional_duration(name, getattr(self, name), example))
            if getattr(self, name) is None:
                raise ConfigError(name, None, "must be a duration", f"pass seconds or a string like {example}")
        set_(self, "warmup_steps", _check_int("warmup_steps", self.warmup_steps, minimum=0))
        set_(self, "profile_window", _check_int("profile_window", self.profile_window, minimum=3))
        for name in ("async_persist", "resume", "adaptive", "verbose", "mirror_takeover", "allow_pickle", "status_file"):
            set_(self, name, _check_bool(name, getattr(self, name)))
        if self.log_metrics is not None:
            set_(self, "log_metrics", _check_bool("log_metrics", self.log_metrics))
        if self.schedule not in SCHEDULES:
            known = ", ".join(repr(s) for s in SCHEDULES)
            raise ConfigError("schedule", self.schedule, "is not a known schedule", f"use one of {known}")
        set_(self, "signals", _check_signals(self.signals))
        resolve_deadline(self.deadline, environ={})  # the form only: Slurm's end time is read at the fit's start
        parse_notice(self.preemption_notice)
        if self.on_preempt not in ON_PREEMPT:
            raise ConfigError(
                "on_preempt",
                self.on_preempt,
                "is not a known action",
                f"use one of {', '.join(repr(a) for a in ON_PREEMPT)}",
            )
        if self.snapshot_mode not in SNAPSHOT_MODES:
            raise ConfigError(
                "snapshot_mode",
                self.snapshot_mode,
                "is not a known snapshot mode",
                f"use one of {', '.join(repr(m) for m in SNAPSHOT_MODES)}",
            )
        if self.persist_mode not in PERSIST_MODES:
            raise ConfigError(
                "persist_mode",
                self.persist_mode,
                "is not a known persist mode",
                f"use one of {', '.join(repr(m) for m in PERSIST_MODES)}",
            )
        if self.schedule == "front_loaded" and self.mtbf is None:
            raise ConfigError(
                "schedule",
                self.schedule,
                "needs a failure rate to weigh early progress against checkpoint cost",
                "set mtbf (e.g. mtbf='6h') or use schedule='uniform'",
            )

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], **overrides: Any) -> "Config":
        """Build from a mapping; unknown keys raise a ConfigError suggesting the closest field."""
        merged = {**dict(values), **overrides}
        names = [f.name for f in dataclasses.fields(cls)]
        for key in merged:
            if key not in names:
                raise unknown_setting(key, merged[key], names, "is not an autockpt setting")
        warn_ignored_with_every_n_steps(merged, stacklevel=2)
        if "dirpath" not in merged:
            raise ConfigError("dirpath", None, "is required", "set dirpath to a directory, e.g. 'ckpts'")
        return cls(**merged)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **overrides: Any) -> "Config":
        """Build from a YAML (.yaml/.yml) or TOML (.toml) file.

        The settings may sit at the top level or under an ``autockpt`` key (TOML: an
        ``[autockpt]`` table), so they can share a file with other settings.
        """
        path = Path(path)
        if not path.is_file():
            raise ConfigError("path", str(path), "does not exist", "pass the path of a YAML or TOML file")
        suffix = path.suffix.lower()
        text = path.read_text(encoding="utf-8")
        if suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml  # here: a run without a YAML file does not pay its import (10 ms)

            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError("path", str(path), "has an unknown suffix", "use a .yaml, .yml or .toml file")
        if not isinstance(data, dict):
            raise ConfigError("path", str(path), "does not hold a mapping of settings", "write key: value pairs")
        if "autockpt" in data and isinstance(data["autockpt"], dict):
            data = data["autockpt"]
        return cls.from_dict(data, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (JSON-serializable)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "Config":
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)


# -- field checks ---------------------------------------------------------------------------


def _check_budget(value: Any) -> float:
    try:
        budget = parse_fraction(value)
    except ValueError as exc:
        raise ConfigError("overhead_budget", value, str(exc), "pass a fraction like 0.02 or '2%'") from None
    if not math.isfinite(budget) or budget <= 0:
        raise ConfigError("overhead_budget", value, "must be a positive fraction", "use e.g. 0.02 for 2%")
    if budget >= 1:
        if isinstance(value, str) and value.strip().endswith("%"):
            fix = "a percentage must be below 100%; typical budgets are '1%' to '5%'"
        elif budget < 100:
            fix = f"overhead_budget is a fraction of training time: use {budget / 100:g} for {budget:g}%"
        else:
            fix = "use a fraction below 1, e.g. 0.02 for 2%"
        raise ConfigError("overhead_budget", value, "is not a fraction below 1", fix)
    if budget > 0.5:
        raise ConfigError(
            "overhead_budget", value, "would let checkpointing take over half the training time",
            "use a budget of at most 0.5 (typical values: 0.01-0.05)",
        )
    return budget


def _check_optional_duration(field: str, value: Any, example: str) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ConfigError(field, value, str(exc), f"pass seconds or a string like {example}") from None
    if seconds <= 0:
        raise ConfigError(field, value, "must be positive", f"pass seconds or a string like {example}")
    return seconds


def _check_int(field: str, value: Any, minimum: int) -> int:
    """A whole number of any integral type (``numpy.int64`` too) or an integral float."""
    if isinstance(value, bool):
        raise ConfigError(field, value, "must be a whole number", f"pass an integer >= {minimum}")
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif isinstance(value, numbers.Real) and float(value).is_integer():
        value = int(value)
    else:
        raise ConfigError(field, value, "must be a whole number", f"pass an integer >= {minimum}")
    if value < minimum:
        raise ConfigError(field, value, f"must be at least {minimum}", f"pass an integer >= {minimum}")
    return value


def _check_optional_positive_int(field: str, value: Any) -> int | None:
    if value is None:
        return None
    return _check_int(field, value, minimum=1)


def _check_signals(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(
            "signals", value, "must be a list of signal names", "pass e.g. signals=('SIGTERM', 'SIGUSR1'), or ()"
        )
    try:
        return signal_names(value)
    except ValueError as exc:
        raise ConfigError(
            "signals", value, str(exc), "use catchable signals such as 'SIGTERM', 'SIGUSR1', 'SIGUSR2' or 'SIGINT'"
        ) from None


def _check_bool(field: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise ConfigError(field, value, "must be true or false", f"pass {field}=True or {field}=False")
