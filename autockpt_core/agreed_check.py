"""Verifying a checkpoint that every process wrote (a sharded model's file set), at a resume,
by every process: each reads its own share of the files (:func:`~.persist.file_set.share_of`)
and the answers are agreed, so no process reads the whole checkpoint and none loads one that
another found corrupt.

Call order (training thread, every process together):

- process 0 runs ``session.resume_record(check=agreed.check)`` (any number of times), then
  ``agreed.done()`` (also when the resume raised);
- every other process runs ``agreed.follow()``, which returns after process 0's ``done()``.

Each ``check(record)`` of a multi-file record is one round: process 0 sends the record's file
list, every process verifies its share, and the first problem found (with the process that
found it) comes back to every process; a single-file record is verified by process 0 alone.
With one process, ``check`` verifies every file and ``done``/``follow`` do nothing.
"""

from __future__ import annotations

import json

from .persist.file_set import share_of, verify_file_set
from .persist.manifest import CheckpointRecord, verify
from .persist.storage import Storage
from .policy.process_group import ProcessGroup

DONE = "done"


class AgreedCheck:
    """See the module docstring. ``storage``: ``dirpath`` as every process sees it."""

    def __init__(self, group: ProcessGroup, storage: Storage) -> None:
        self.group = group
        self.storage = storage
        self.rounds = 0
        """Multi-file records checked (one collective round each)."""

    def check(self, record: CheckpointRecord) -> str | None:
        """Process 0: None when every process found its share of ``record`` intact, else the problem."""
        if record.files is None or self.group.count <= 1:
            return verify(self.storage, record)
        self.group.text_from(0, json.dumps([record.name, record.files, record.algorithm]))
        return self._round(record.name, record.files, record.algorithm)

    def done(self) -> None:
        """Process 0: no more checks; the other processes' :meth:`follow` returns."""
        if self.group.count > 1:
            self.group.text_from(0, DONE)

    def follow(self) -> None:
        """Every process but 0: take part in process 0's checks until its :meth:`done`."""
        while (text := self.group.text_from(0, "")) != DONE:
            name, files, algorithm = json.loads(text)
            self._round(name, files, algorithm)

    def _round(self, name: str, files: dict[str, list[object]], algorithm: str) -> str | None:
        self.rounds += 1
        group = self.group
        try:
            problem = verify_file_set(self.storage, name, share_of(files, group.index, group.count), algorithm)
        except OSError as exc:  # an unreadable file is a problem of this checkpoint, not of the job
            problem = f"{type(exc).__name__}: {exc}"
        found = int(group.max_over_processes([group.index + 1 if problem is not None else 0])[0])
        if found == 0:
            return None
        text = group.text_from(found - 1, problem or "")
        return f"{text} (checked by {group.member} {found - 1})"
