"""Fetched copies left in the temporary directory by killed resumes (``persist/fetched_copies``)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from autockpt_core.persist import LocalStorage
from autockpt_core.persist.fetched_copies import PREFIX, remove_stale_copies
from autockpt_core.persist.storage import TEMP_PREFIX, FsspecStorage
from autockpt_core.persist.verified_fetch import FetchWhileVerifying
from tests.core.persist.committing import commit


def aged(path: Path, hours: float) -> Path:
    path.write_bytes(b"x" * 10)
    then = time.time() - hours * 3600
    os.utime(path, (then, then))
    return path


def test_copies_older_than_a_day_go_and_newer_ones_and_other_files_stay(tmp_path: Path) -> None:
    old_copy = aged(tmp_path / f"{PREFIX}abc-node0.ckpt", 30)
    old_partial = aged(tmp_path / f"{TEMP_PREFIX}0123456789ab-{PREFIX}def.ckpt", 30)
    in_use = aged(tmp_path / f"{PREFIX}ghi-node0.ckpt", 1)  # another job's resume, loading now
    unrelated = aged(tmp_path / "ckpt-step000000005.ckpt", 30)
    assert remove_stale_copies(str(tmp_path)) == 2
    assert not old_copy.exists() and not old_partial.exists()
    assert in_use.exists() and unrelated.exists()


def test_a_resume_that_fetches_cleans_up_first_and_one_that_only_verifies_reads_no_directory(tmp_path: Path) -> None:
    old_copy = aged(tmp_path / f"{PREFIX}left-by-a-kill.ckpt", 25)
    local = LocalStorage(tmp_path / "ckpts")
    verifies = FetchWhileVerifying(local, directory=tmp_path)
    assert verifies.check(commit(local, 1)) is None
    assert old_copy.exists()  # a local checkpoint is verified in place: nothing fetched, nothing cleaned
    remote = FsspecStorage(f"memory://fetched/{uuid.uuid4().hex[:8]}")
    fetches = FetchWhileVerifying(remote, directory=tmp_path)
    try:
        assert fetches.check(commit(remote, 2)) is None  # type: ignore[arg-type]
    finally:
        fetches.discard()
    assert not old_copy.exists()
