"""Run a worker until its job is done, SIGKILLing each process at its failure time (real kills).

Called from the command's thread. Each attempt is a new process in its own session (so the kill
reaches every process it started); attempt ``i`` is killed ``gaps[i]`` seconds after it was
started unless it exited first. Rerunning the same command is how every method resumes: the
worker finds the checkpoints in its directory. Returns one record per attempt.

With ``notice_s``, each kill is announced: SIGTERM goes to the worker's main process
``notice_s`` seconds before it (as a scheduler's or a cloud's preemption notice reaches a job),
and the SIGKILL follows at the kill time if the process still runs. A process that exits after
the notice met its failure there (``noticed``; a method with no handler dies by the SIGTERM, one
like autockpt's commits a checkpoint and exits 128 + 15, Lightning's own handler exits 0),
unless ``done()`` says its job had finished; the next attempt starts at the kill time all the
same (the machine is gone until then).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence


@dataclasses.dataclass
class Attempt:
    started: float  # time.time() at the spawn
    ended: float
    gap_s: float  # when the kill was due, seconds after ``started``
    killed: bool  # its failure happened: the SIGKILL, or the exit after a notice
    returncode: int | None
    noticed: bool = False  # SIGTERM was sent ``notice_s`` before the kill time

    @property
    def wall_s(self) -> float:
        return self.ended - self.started


def run_until_done(
    cmd: Sequence[str],
    env: dict[str, str],
    gaps: Iterator[float],
    log_path: str | os.PathLike[str],
    *,
    max_attempts: int,
    max_wall_s: float,
    notice_s: float = 0.0,
    done: Callable[[], bool] = lambda: False,
) -> tuple[list[Attempt], bool]:
    """``(attempts, finished)``; stops early (unfinished) after ``max_attempts`` or ``max_wall_s``.

    A process that exits non-zero without being killed or noticed ends the loop: that is a bug,
    not a failure being injected, and the caller reports it with the log. ``notice_s`` and
    ``done``: see the module docstring.
    """
    attempts: list[Attempt] = []
    total = 0.0
    with open(log_path, "a", encoding="utf-8") as log:
        for _ in range(max_attempts):
            gap = next(gaps)
            started = time.time()
            proc = subprocess.Popen(list(cmd), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            budget = min(gap, max(0.0, max_wall_s - total))
            noticed = False
            rc: int | None = None
            if 0.0 < notice_s < budget:
                rc = _wait(proc, budget - notice_s)
                if rc is None:
                    noticed = _signal(proc.pid, signal.SIGTERM)
                    budget = notice_s
            if rc is None:
                rc = _wait(proc, budget)
            killed = rc is None or (noticed and not done())  # a noticed exit met its failure there
            if killed or noticed:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # what it started goes with it
                rc = proc.wait() if rc is None else rc
            if killed and noticed:  # the machine goes at the kill time: the rerun starts no earlier
                time.sleep(max(0.0, started + min(gap, max_wall_s - total) - time.time()))
            attempts.append(Attempt(started, time.time(), gap, killed, rc, noticed))
            total += attempts[-1].wall_s
            if not killed:
                return attempts, rc == 0 or noticed
            if total >= max_wall_s:
                break
    return attempts, False


def _wait(proc: subprocess.Popen[bytes], seconds: float) -> int | None:
    """Its exit status, or None while it still runs after ``seconds``."""
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def _signal(pid: int, signum: int) -> bool:
    """Send ``signum`` to the process (not its group: a job's main process gets the notice)."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True
