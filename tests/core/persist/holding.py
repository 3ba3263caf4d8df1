"""A real second process that holds the directory lock: ``holding`` fixture (see conftest)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import autockpt_core

ROOT = Path(autockpt_core.__file__).resolve().parents[1]

HOLD = """
import os, sys, time
from autockpt_core import CheckpointSession, Config
session = CheckpointSession(Config(dirpath=sys.argv[1]), framework="other-fw", suffix=".st")
session.start(0)
if sys.argv[2] == "fork":
    child = os.fork()
    if child == 0:  # a DataLoader-like worker that outlives its parent
        os.write(1, b"FORKED\\n")  # Python code runs in the child: its at-fork hooks ran
        time.sleep(120)
        os._exit(0)
    os.write(1, f"CHILD {child}\\n".encode())  # one write each: the two processes share the pipe
print("LOCKED", flush=True)
if sys.stdin.readline() == "finish\\n":
    session.finish()
    print("RELEASED", flush=True)
    sys.stdin.readline()
"""


class Holding:
    """A real second process that holds the lock on ``dirpath`` until told or killed."""

    def __init__(self, dirpath: Path, mode: str = "plain") -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(dirpath), mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.child: int | None = None
        expected = {"LOCKED", "FORKED"} if mode == "fork" else {"LOCKED"}
        while expected:
            line = self.readline()
            expected.discard(line)
            if line.startswith("CHILD"):
                self.child = int(line.split()[1])

    def readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the holder process ended early (rc={self.proc.poll()})"
        return line.strip()

    def tell(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        if self.child is not None:
            try:
                os.kill(self.child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def holding_processes(tmp_path: Path) -> Iterator[Callable[..., Holding]]:
    """The ``holding`` fixture: start holders on ``tmp_path``; all are killed at the end."""
    started: list[Holding] = []

    def start(mode: str = "plain") -> Holding:
        started.append(Holding(tmp_path, mode))
        return started[-1]

    yield start
    for h in started:
        h.close()
