"""Progress over a command's runs: a bar on a terminal, one plain line per run elsewhere.

``autockpt compare`` and ``autockpt goodput`` run dozens of processes for minutes. On a terminal
a rich bar shows where they are; with stdout in a file (CI, nohup, a Slurm job) a bar prints
nothing, so each run then prints one line as it starts: ``run 3/21: keras fixed every 85 steps
(elapsed 1m02s, about 6m40s left)``, the estimate from the mean time of the runs done so far.

Call order (the command's thread): ``with RunProgress(console, total, title) as progress:``,
then per run ``progress.start(description)`` and ``progress.done()``, or ``progress.skip()`` for
a run not to be run after all (``autockpt compare`` found it done by an earlier invocation).
"""

from __future__ import annotations

import time
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


def _minutes(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class RunProgress:
    """``total`` runs under ``title``; a bar where ``console`` is a terminal, else lines."""

    def __init__(self, console: Console, total: int, title: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.total, self.title = console, total, title
        self.finished = 0
        self._clock = clock
        self._started = clock()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> "RunProgress":
        self._started = self._clock()
        if self.console.is_terminal:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.title, total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def line(self, description: str) -> str:
        """The plain line of the run starting now."""
        elapsed = self._clock() - self._started
        left = f", about {_minutes(elapsed / self.finished * (self.total - self.finished))} left" if self.finished else ""
        return f"run {self.finished + 1}/{self.total}: {description} (elapsed {_minutes(elapsed)}{left})"

    def start(self, description: str) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=description)
        else:
            self.console.print(self.line(description), highlight=False, soft_wrap=True)

    def skip(self) -> None:
        """One of the ``total`` runs is not run: the count and the estimate leave it out."""
        self.total -= 1
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, total=self.total)

    def done(self) -> None:
        self.finished += 1
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task)
