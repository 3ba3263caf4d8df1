"""Child side of the fault harness: runs inside the training script under test.

The parent (``harness.py``) passes one fault per process in the environment:

- ``AUTOCKPT_FAULT_PLAN``: JSON ``{"phase": ..., "nth" or "at": ..., "action": ...}``
  (absent: no fault);
- ``AUTOCKPT_FAULT_LOG``: a file the child appends one JSON line to right before acting (with
  its ``time.time()``), so the parent can check that the fault happened where and when it was
  planned.

Phases, and where the script reports them:

=============  ==========================================================================
``step``       the script calls ``plan.hit("step", step=s)`` inside every training step;
               ``at`` is the global step (0-based, before the step's update)
``val``        Lightning script: inside every validation step of fit(); Keras script: at every
               validation batch's start in fit() (``step`` = global step)
``sanity``     Lightning script: inside every validation step of the sanity check
``snapshot``   the script calls ``plan.hit("snapshot")`` inside the snapshot (phase 1)
``persist``    ``FaultStorage``: the checkpoint file is half written (temporary name); with
               the persist process, :func:`write_records_with_faults` in that process
``commit``     ``FaultStorage``: the file is renamed into place, the manifest not yet written
``retention``  ``FaultStorage``: the manifest dropped an old record, its file not yet deleted
=============  ==========================================================================

``nth`` counts hits of that phase in this process (1 = first); ``rank`` (optional) limits the
fault to the process of that global rank (``RANK``/``LOCAL_RANK`` in its environment; 0 when
unset). Actions: ``kill`` (SIGKILL itself: nothing runs after it, not even ``finally`` blocks
or the writer thread; with :data:`KILL_JOB_ENV` set, SIGKILL of its whole process group, every
rank and persist process at once, as torchrun tears a job down),
``sigterm`` (sends itself SIGTERM and goes on: the preemption path; ``sigterm2``/``sigterm3``
send it 2 or 3 times, 3 ms apart), ``sigint`` (SIGINT to its whole process group and goes on,
as Ctrl-C in a terminal), ``enospc`` / ``eacces``
(the write raises ``OSError``; persist phase only).

Framework-free (stdlib and autockpt_core only; :func:`write_records_with_faults` imports
autockpt_torch when it runs). Test-only: nothing in the library reads these variables.

With ``persist_mode="process"`` the checkpoint file is written by autockpt's persist process,
which inherits the environment: the script names :data:`PROCESS_WRITE` as the write function
(it resolves there by name) and builds ``FaultStorage(..., process_writable=True)`` so the
commit and retention phases stay injected in the training process, where they run. A kill in
the persist process takes the training process (its parent) down first, as a node failure
takes both.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from typing import IO, Any, Callable, NoReturn

from autockpt_core import MANIFEST_NAME, LocalStorage, WriteResult

PLAN_ENV = "AUTOCKPT_FAULT_PLAN"
LOG_ENV = "AUTOCKPT_FAULT_LOG"
KILL_JOB_ENV = "AUTOCKPT_FAULT_KILL_JOB"  # "1": a kill takes the whole process group (all ranks)
PHASES = ("step", "val", "sanity", "snapshot", "persist", "commit", "retention")
ACTIONS = ("kill", "sigterm", "sigterm2", "sigterm3", "sigint", "enospc", "eacces")


class FaultPlan:
    """The fault for this process (or none); ``hit(phase)`` acts when the plan says so."""

    def __init__(self, plan: dict[str, Any] | None, log_path: str | None = None) -> None:
        self.plan = plan or {}
        self.log_path = log_path
        self.counts: dict[str, int] = {}
        self.done = False
        if self.plan:
            if self.plan.get("phase") not in PHASES:
                raise ValueError(f"unknown fault phase {self.plan.get('phase')!r}; known: {PHASES}")
            if self.plan.get("action", "kill") not in ACTIONS:
                raise ValueError(f"unknown fault action {self.plan.get('action')!r}; known: {ACTIONS}")

    @classmethod
    def from_env(cls) -> "FaultPlan":
        raw = os.environ.get(PLAN_ENV)
        return cls(json.loads(raw) if raw else None, os.environ.get(LOG_ENV))

    @property
    def action(self) -> str:
        return str(self.plan.get("action", "kill"))

    def due(self, phase: str, step: int | None = None) -> bool:
        """Count a hit of ``phase``; True when the plan's fault happens at this hit."""
        if not self.plan or self.done or self.plan["phase"] != phase:
            return False
        if "rank" in self.plan and int(self.plan["rank"]) != process_rank():
            return False
        self.counts[phase] = self.counts.get(phase, 0) + 1
        if "at" in self.plan:
            return step is not None and step >= int(self.plan["at"])
        return self.counts[phase] >= int(self.plan.get("nth", 1))

    def hit(self, phase: str, step: int | None = None, *, target: int | None = None, **info: Any) -> None:
        """Report reaching ``phase``; kills or signals this process when the plan says so.

        ``target``: the training process, when this is another one (the persist process): it
        is killed (or signalled) first, and this process killed after it.
        """
        if not self.due(phase, step):
            return
        self.done = True
        self.log(phase=phase, step=step, action=self.action, rank=process_rank(), time=time.time(), **info)
        training = target if target is not None else os.getpid()
        if self.action == "kill":
            if os.environ.get(KILL_JOB_ENV) == "1":
                os.killpg(os.getpgrp(), signal.SIGKILL)  # every rank of the job, this one included
            os.kill(training, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.action.startswith("sigterm"):
            for i in range(int(self.action[len("sigterm"):] or 1)):  # repeats 3 ms apart, as srun + torchrun
                if i:
                    time.sleep(0.003)
                os.kill(training, signal.SIGTERM)
        elif self.action == "sigint":
            os.killpg(os.getpgid(training), signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
        else:
            raise self.error()

    def error(self) -> OSError:
        if self.action == "eacces":
            return PermissionError(errno.EACCES, "Permission denied (injected)")
        return OSError(errno.ENOSPC, "No space left on device (injected)")

    def log(self, **event: Any) -> None:
        if self.log_path:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"pid": os.getpid(), **event}) + "\n")
                f.flush()
                os.fsync(f.fileno())


def process_rank() -> int:
    """This process's global rank (torchrun and Lightning set ``RANK`` or ``LOCAL_RANK``; 0 when unset)."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def exit_without_teardown(status: int) -> NoReturn:
    """End a multi-process (gloo) script once its results are written: flush and ``os._exit``,
    skipping the interpreter's finalization. The Lightning scripts with several ranks, the
    Keras script's ``jaxdist`` job and ``tests/keras/jax_distributed_worker.py`` (both after
    ``jax.distributed.shutdown()``) end this way.

    After a Lightning ``ModelParallelStrategy`` (FSDP2) run on gloo had finished, a rank
    rarely aborted with "terminate called without an active exception" (exit -6; -9 when
    Lightning's child-process observer then kills rank 0): once in about 20 local runs, and once
    in CI, in the *baseline* run, where no autockpt code runs; not in 48 further local runs.
    ``destroy_process_group`` before exit did not prevent it. Likely cause: FSDP2's state keeps
    its process groups alive past ``destroy_process_group``, so torch tears them down during
    the interpreter's finalization, when a thread that needs the GIL is ended in C++ code.
    The fault tests test resume, not torch's teardown. Single-process scripts still exit
    normally, so an abort at exit caused by autockpt's own threads is still seen there.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class _HalfWayFile:
    """Passes writes through; calls ``at_half()`` once after the first ``half`` bytes."""

    def __init__(self, raw: IO[bytes], half: int, at_half: Callable[[], None]) -> None:
        self._raw, self._left, self._at_half = raw, half, at_half

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self._left is None or len(view) < self._left:
            if self._left is not None:
                self._left -= len(view)
            return self._raw.write(view)
        head, tail = view[: self._left], view[self._left :]
        self._raw.write(head)
        self._raw.flush()
        self._left = None
        self._at_half()  # kills the process or raises, when the plan says so
        self._raw.write(tail)
        return len(view)

    def flush(self) -> None:
        self._raw.flush()


class FaultStorage(LocalStorage):
    """LocalStorage that reports the persist, commit and retention phases to a :class:`FaultPlan`.

    ``suffix`` selects the checkpoint files (``.ckpt`` for Lightning, ``.safetensors`` for
    Keras); ``half`` is how many bytes of a checkpoint file are written before the persist
    phase is reported.
    """

    def __init__(self, root: str, plan: FaultPlan, suffix: str, half: int = 4096, process_writable: bool = False) -> None:
        super().__init__(root)
        self.plan, self.suffix, self.half = plan, suffix, half
        self.process_writable = process_writable  # see the module docstring

    def write_atomic(self, name: str, write: Callable[[IO[bytes]], object]) -> WriteResult:
        if name == MANIFEST_NAME:
            self.plan.hit("commit", name=name)
            return super().write_atomic(name, write)
        if not name.endswith(self.suffix):
            return super().write_atomic(name, write)

        def at_half() -> None:
            self.plan.hit("persist", name=name)

        return super().write_atomic(name, lambda f: write(_HalfWayFile(f, self.half, at_half)))  # type: ignore[arg-type]

    def delete(self, name: str) -> None:
        if name.endswith(self.suffix):
            self.plan.hit("retention", name=name)
        super().delete(name)


PROCESS_WRITE = "tests.fault.child:write_records_with_faults"
""":func:`write_records_with_faults` by name, for the persist process (Lightning script, process mode)."""
HALF = 2048
"""Bytes of a checkpoint file written before the persist phase is reported in the persist process."""
_PROCESS_PLAN: FaultPlan | None = None  # the persist process's own count of persist hits


def write_records_with_faults(file: IO[bytes], *, records: Any, zip_crc32: bool = True) -> None:
    """``autockpt_torch.process_write.write_records`` in the persist process, reporting the
    persist phase after :data:`HALF` bytes; the kill or signal reaches the training process
    (its parent) first."""
    global _PROCESS_PLAN
    from autockpt_torch.process_write import write_records

    if _PROCESS_PLAN is None:
        _PROCESS_PLAN = FaultPlan.from_env()
    plan = _PROCESS_PLAN

    def at_half() -> None:
        plan.hit("persist", target=os.getppid(), in_persist_process=True)

    write_records(_HalfWayFile(file, HALF, at_half), records=records, zip_crc32=zip_crc32)  # type: ignore[arg-type]


def report(run: Callable[[], dict[str, Any]], out: str) -> None:
    """Write ``run()``'s result, or the traceback that ended it as ``{"error": ...}``, to ``out`` (JSON)."""
    import traceback

    try:
        result = run()
    except BaseException:  # noqa: BLE001 - reported to the test
        result = {"error": traceback.format_exc()}
    with open(out, "w") as f:
        json.dump(result, f)
