"""What interrupted writes leave (temporary files, checkpoint files the manifest does not list)
is removed when a session resumes, only under the directory lock, and nothing else is."""

from __future__ import annotations

from pathlib import Path

import pytest

from autockpt_core import (
    CheckpointSession,
    Config,
    DirectoryLockedError,
    Snapshot,
    read_manifest,
)
from autockpt_core.persist.lock import LOCK_NAME
from autockpt_core.persist.names import checkpoint_name, is_checkpoint_name
from autockpt_core.persist.storage import TEMP_PREFIX

ORPHANS = ["ckpt-step000000003.st", "ckpt-step000000002-v2.st", "ckpt-step1234567890.st"]
KEPT = [
    "notes.txt",
    "ckpt-step000000003.ckpt",  # another suffix: another framework's file
    "ckpt-step3.st",  # not autockpt's naming
    "ckpt-step000000003.st.bak",
    "my-ckpt-step000000003.st",
]


def session(tmp_path: Path, **config) -> CheckpointSession:
    cfg = Config(dirpath=str(tmp_path), async_persist=False, keep_last=10, **config)
    return CheckpointSession(cfg, framework="np", suffix=".st")


def commit_steps(tmp_path: Path, *steps: int) -> None:
    s = session(tmp_path)
    s.start(0)
    for step in steps:
        s.save(step, 0, lambda pool: Snapshot(write=lambda f: f.write(b"state"), nbytes=5))
    s.finish()


def litter(tmp_path: Path) -> None:
    for name in ORPHANS + KEPT + [f"{TEMP_PREFIX}abc-ckpt-step000000003.st"]:
        (tmp_path / name).write_bytes(b"left over")


@pytest.mark.parametrize(
    "name, ours",
    [
        ("ckpt-step000000012.st", True),
        ("ckpt-step000000012-v2.st", True),
        ("ckpt-step000000012-v13.st", True),
        ("ckpt-step1000000000.st", True),  # steps past 9 digits
        ("ckpt-step00000012.st", False),
        ("ckpt-step000000012-v.st", False),
        ("ckpt-step000000012.ckpt", False),
        ("ckpt-step000000012.st.tmp", False),
        ("xckpt-step000000012.st", False),
    ],
)
def test_checkpoint_names_match_only_autockpts_pattern(name: str, ours: bool) -> None:
    assert is_checkpoint_name(name, ".st") is ours
    assert is_checkpoint_name(checkpoint_name(12, ".st", 4), ".st")


def test_a_resume_removes_unlisted_checkpoint_files_and_temporaries_only(tmp_path: Path) -> None:
    commit_steps(tmp_path, 1, 2)
    litter(tmp_path)
    s = session(tmp_path)
    record = s.resume_record()
    assert record is not None and record.step == 2
    listed = sorted(r.name for r in read_manifest(s.storage))
    kept = [*listed, *KEPT, LOCK_NAME, "autockpt-manifest.json", "autockpt-status.json"]  # status: steps 1-2's session
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    s.start(2)
    s.save(3, 0, lambda pool: Snapshot(write=lambda f: f.write(b"new"), nbytes=3))
    assert s.records()[-1].name == "ckpt-step000000003.st"  # the orphan's name is free again
    s.finish()


@pytest.mark.parametrize("resume", [True, False])
def test_no_orphan_is_removed_without_a_manifest_and_nothing_without_resume(tmp_path: Path, resume: bool) -> None:
    if not resume:
        commit_steps(tmp_path, 1)
    litter(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    s = session(tmp_path, resume=resume)
    s.start(0)
    temporaries = [] if not resume else [n for n in before if n.startswith(TEMP_PREFIX)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({*before, LOCK_NAME} - {*temporaries})
    s.finish()


def test_a_session_that_cannot_get_the_lock_removes_nothing(tmp_path: Path, holding) -> None:
    commit_steps(tmp_path, 1)
    holding()  # a live writer in another process ...
    litter(tmp_path)  # ... whose file in progress looks like a temporary, or an unlisted file
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(DirectoryLockedError):
        session(tmp_path).resume_record()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_unreadable_manifest_at_resume_removes_nothing_and_releases_the_lock(tmp_path: Path) -> None:
    commit_steps(tmp_path, 1)
    litter(tmp_path)
    manifest = tmp_path / "autockpt-manifest.json"
    good = manifest.read_bytes()
    manifest.write_text("[]")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match="cannot read autockpt-manifest.json"):
        session(tmp_path).resume_record()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    manifest.write_bytes(good)
    s = session(tmp_path)
    assert s.resume_record().step == 1  # type: ignore[union-attr]
    s.finish()
