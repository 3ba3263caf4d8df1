"""``dirpath/autockpt-status.json``: what stopping the job now would cost, for a scheduler to read.

A scheduler that must stop one of several jobs (a preemption, a higher-priority job) wants the
one that loses least: the work since its last durable checkpoint, and how long an emergency
checkpoint would take before it can go. :class:`StatusFile` keeps a small JSON file in a local
``dirpath`` current with those figures; ``autockpt status DIR`` prints it.

The keys: ``state`` (:data:`STATES`), ``step``, ``last_durable_step``, ``last_durable_time``
(Unix seconds of its commit), ``work_at_risk_s`` (training time since that checkpoint: the
steps since it times the measured step time), ``emergency_checkpoint_s`` (the measured stall
plus persist time of a checkpoint), ``next_checkpoint_step`` (the policy's next due step),
and ``run``, ``host``, ``pid``, ``updated`` (Unix seconds). Figures not measured yet are null.

Writes are atomic (a temporary file renamed over the old one; no fsync: the file is advice,
rewritten every few seconds, and a crash loses nothing a checkpoint holds). A write that fails
is logged once and the file is then left alone: the job's checkpoints do not depend on it.
Only a local ``dirpath`` has one (object storage would make each update a request).

Call order and threading (the session's, :mod:`autockpt_core.session`): :meth:`StatusFile.report`
on the training thread at each decision and checkpoint (written when the state changes, else at
most every ``every_s`` seconds), :meth:`StatusFile.durable` on the writer thread at each commit
(always written; ``checkpointing`` turns back to ``training``), :meth:`StatusFile.end` once when
the session ends. A ``preempted`` state stays
through the session's end; ``finished`` and ``failed`` are final.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .policy import Estimates

log = logging.getLogger("autockpt")

STATUS_NAME = "autockpt-status.json"
STATES = ("training", "checkpointing", "preempted", "finished", "failed")
KEYS = ("state", "step", "last_durable_step", "last_durable_time", "work_at_risk_s", "emergency_checkpoint_s",
        "next_checkpoint_step", "signal_to_durable_s", "run", "host", "pid", "updated")
FINAL = ("preempted", "finished", "failed")


@dataclasses.dataclass
class _Figures:
    state: str = "training"
    step: int | None = None
    durable_step: int | None = None
    durable_time: float | None = None
    step_s: float | None = None
    emergency_s: float | None = None
    next_step: int | None = None
    signal_to_durable_s: float | None = None  # a preemption's, once its checkpoint is committed


class StatusFile:
    """The status file of one session (``path`` None: none is written, e.g. a URL ``dirpath``)."""

    def __init__(self, path: str | os.PathLike[str] | None, *, every_s: float = 5.0,
                 wall: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path) if path is not None else None
        self.every_s = every_s
        self.run: str | None = None
        self._wall, self._clock = wall, clock
        self._figures = _Figures()
        self._last_write = -float("inf")
        self._lock = threading.Lock()
        self._broken = False

    def due(self, state: str) -> bool:
        """Whether :meth:`report` of ``state`` would write now, or (no file) refresh the figures
        :meth:`emergency_lead_s` reads; callers skip gathering figures if not."""
        if self.path is None or self._broken:
            return self._interval_passed()
        return state != self._figures.state or self._interval_passed()

    def emergency_lead_s(self) -> float | None:
        """The measured cost of an emergency checkpoint now: a step to reach its boundary, the
        stall and the persist (None before a checkpoint was measured). Any thread."""
        f = self._figures
        emergency, step = f.emergency_s, f.step_s
        return None if emergency is None else emergency + (step or 0.0)

    def report(self, state: str, step: int, *, run: str | None = None, estimates: Estimates | None = None,
               next_step: int | None = None, force: bool = False) -> None:
        """The training thread's view (a decision, a checkpoint, a preemption); ``estimates``:
        the profiler's (the step time; a checkpoint's stall and persist time)."""
        with self._lock:
            f = self._figures
            if f.state in FINAL and state != "preempted":
                return
            changed = state != f.state
            f.state, f.step, f.next_step = state, step, next_step
            self.run = run if run is not None else self.run
            if estimates is not None:
                f.step_s = estimates.iter_time_s if estimates.iter_time_s is not None else f.step_s
                if estimates.stall_s is not None and estimates.persist_s is not None:
                    f.emergency_s = estimates.stall_s + estimates.persist_s
            self._write(force or changed)

    def durable(self, step: int, created: float) -> None:
        """A checkpoint of ``step`` was committed at ``created`` (Unix seconds; writer thread)."""
        with self._lock:
            f = self._figures
            if f.durable_step is None or step >= f.durable_step:
                f.durable_step, f.durable_time = step, created
            if f.state == "checkpointing":
                f.state = "training"
            self._write(True)

    def preempted(self, step: int, signal_to_durable_s: float) -> None:
        """The emergency checkpoint of ``step`` is committed, ``signal_to_durable_s`` after the
        signal (or notice, or deadline) asked for it (training thread)."""
        with self._lock:
            f = self._figures
            f.state, f.step, f.next_step, f.signal_to_durable_s = "preempted", step, None, signal_to_durable_s
            self._write(True)

    def end(self, state: str) -> None:
        """The session ended: ``finished`` or ``failed`` (a preempted session stays ``preempted``)."""
        with self._lock:
            f = self._figures
            if f.state in FINAL:
                return
            f.state, f.next_step = state, None
            self._write(True)

    def contents(self) -> dict[str, Any]:
        """What the file holds now (the keys of :data:`KEYS`)."""
        f = self._figures
        at_risk = None
        if f.step is not None and f.step_s is not None:
            at_risk = max(0, f.step - (f.durable_step or 0)) * f.step_s
        return {
            "state": f.state, "step": f.step, "last_durable_step": f.durable_step,
            "last_durable_time": f.durable_time, "work_at_risk_s": at_risk,
            "emergency_checkpoint_s": f.emergency_s, "next_checkpoint_step": f.next_step,
            "signal_to_durable_s": f.signal_to_durable_s,
            "run": self.run, "host": socket.gethostname(), "pid": os.getpid(), "updated": self._wall(),
        }

    def _interval_passed(self) -> bool:
        return self._clock() - self._last_write >= self.every_s

    def _write(self, force: bool) -> None:
        if not force and not self._interval_passed():
            return
        self._last_write = self._clock()
        if self.path is None or self._broken:
            return  # the figures alone were refreshed
        temporary = self.path.with_name(f".autockpt-tmp-status-{os.getpid()}")  # removed at a resume if left
        try:
            temporary.write_text(json.dumps(self.contents(), indent=1) + "\n", encoding="utf-8")
            os.replace(temporary, self.path)
        except OSError as exc:
            self._broken = True
            log.warning("autockpt: cannot write the status file %s (%s); it is not updated again in this run",
                        self.path, exc)


def read_status(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The status file in directory ``path``; None where there is none."""
    try:
        with open(Path(path) / STATUS_NAME, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None
