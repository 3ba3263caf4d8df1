"""``DIR/runs.jsonl``: the runs of ``autockpt compare`` as they finish, so a rerun goes on where one stopped.

One JSON object per line, appended, flushed and fsynced as each run finishes (its training
process and, where there is one, its restore process)::

    {"id": IDENTITY, "failed": false, "run": RUN}

``RUN`` is the run as ``results.json`` lists it (:mod:`.report`), with ``wall_s``, the seconds
its processes took. ``IDENTITY`` is everything that defines the run: which worker trains which
workload (its sizes) with which method (its parameters), the repetition, the steps, and the
settings that go into the worker's spec (``compare._identity`` builds it). ``failed`` is true
where the training or the restore process ended in an error.

A rerun with the same ``--out`` reuses each run it plans whose ``IDENTITY`` a line holds and that
did not fail; it measures the others (a failed run is measured again). Rows of other settings
(another interval, other workloads, other versions) stay in the file, unused. ``fresh=True``
moves the file to ``runs.old.jsonl`` (one generation kept) and starts an empty one. A torn last
line (the command killed in the middle of writing it) is cut off when the log is opened.

Call order (the command's thread, the only one): ``with RunLog(path, fresh=...) as log:``, then
per planned run ``log.reuse(identity)`` (the recorded run, or None), and after measuring one
``log.append(identity, run)``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE = "runs.jsonl"
OLD = "runs.old.jsonl"


def _key(identity: dict[str, Any]) -> str:
    return json.dumps(identity, sort_keys=True, separators=(",", ":"))


def failed(run: dict[str, Any]) -> bool:
    """Whether the run's training or restore process ended in an error (it is measured again)."""
    return "error" in run["train"] or "error" in (run.get("restore") or {})


def _cut_torn_tail(path: Path) -> None:
    """Truncate ``path`` after its last newline (a line without one was cut short)."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


class RunLog:
    """The append-only log of one ``--out`` directory; see the module docstring."""

    def __init__(self, path: str | os.PathLike[str], *, fresh: bool = False) -> None:
        self.path = Path(path)
        self.appended = 0
        if fresh and self.path.exists():
            os.replace(self.path, self.path.with_name(OLD))
        self._done: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            _cut_torn_tail(self.path)
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not row.get("failed"):
                    self._done[_key(row["id"])] = row["run"]
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by __exit__

    @property
    def recorded(self) -> int:
        """Runs in the file that did not fail (of any settings)."""
        return len(self._done)

    def reuse(self, identity: dict[str, Any]) -> dict[str, Any] | None:
        """The run recorded under ``identity`` that did not fail, else None (measure it)."""
        run = self._done.get(_key(identity))
        return json.loads(json.dumps(run)) if run is not None else None

    def append(self, identity: dict[str, Any], run: dict[str, Any]) -> None:
        """Record a finished run: one line, flushed and fsynced before this returns."""
        self._file.write(json.dumps({"id": identity, "failed": failed(run), "run": run}) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.appended += 1
        if not failed(run):
            self._done[_key(identity)] = run

    def __enter__(self) -> "RunLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()
