"""Run a worker until its job is done, SIGKILLing each process at its failure time (real kills).

Called from the command's thread. Each attempt is a new process in its own session (so the kill
reaches every process it started); attempt ``i`` is killed ``gaps[i]`` seconds after it was
started unless it exited first. Rerunning the same command is how every method resumes: the
worker finds the checkpoints in its directory. Returns one record per attempt.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence


@dataclasses.dataclass
class Attempt:
    started: float  # time.time() at the spawn
    ended: float
    gap_s: float  # when the kill was due, seconds after ``started``
    killed: bool
    returncode: int | None

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
) -> tuple[list[Attempt], bool]:
    """``(attempts, finished)``; stops early (unfinished) after ``max_attempts`` or ``max_wall_s``.

    A process that exits non-zero without being killed ends the loop: that is a bug, not a failure
    being injected, and the caller reports it with the log.
    """
    attempts: list[Attempt] = []
    total = 0.0
    with open(log_path, "a", encoding="utf-8") as log:
        for _ in range(max_attempts):
            gap = next(gaps)
            started = time.time()
            proc = subprocess.Popen(list(cmd), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            budget = min(gap, max(0.0, max_wall_s - total))
            try:
                rc: int | None = proc.wait(timeout=budget)
                killed = False
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rc = proc.wait()
                killed = True
            attempts.append(Attempt(started, time.time(), gap, killed, rc))
            total += attempts[-1].wall_s
            if not killed:
                return attempts, rc == 0
            if total >= max_wall_s:
                break
    return attempts, False
