"""Two tiers (``autockpt_core.persist.tiers``): copying a checkpoint between them, and which
checkpoint a resume takes when a fast tier and a mirror disagree."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest

from autockpt_core.persist import LocalStorage, read_manifest
from autockpt_core.persist.manifest import CheckpointRecord, write_manifest
from autockpt_core.persist.names import free_name
from autockpt_core.persist.tiers import copy_checkpoint, hydrate, newest_of_tiers, same_checkpoint
from tests.core.persist.committing import commit


def mirror_of(source: LocalStorage, target: LocalStorage, record: CheckpointRecord) -> CheckpointRecord:
    return copy_checkpoint(source, target, record)[0]


@pytest.fixture()
def tiers(tmp_path: Path) -> tuple[LocalStorage, LocalStorage]:
    return LocalStorage(tmp_path / "fast"), LocalStorage(tmp_path / "mirror")


def test_a_copy_keeps_content_and_run_and_takes_the_targets_next_seq(tiers: tuple[LocalStorage, LocalStorage]) -> None:
    fast, mirror = tiers
    older = commit(mirror, 1, run="other")
    record = commit(fast, 5)
    copied, records = copy_checkpoint(fast, mirror, record)
    assert same_checkpoint(copied, record) and copied.name == record.name
    assert copied.seq == older.seq + 1 and [r.name for r in records] == [older.name, copied.name]
    assert read_manifest(mirror)[-1] == copied
    assert (mirror.root / copied.name).read_bytes() == (fast.root / record.name).read_bytes()


def test_a_copy_never_overwrites_a_file_of_the_same_name(tiers: tuple[LocalStorage, LocalStorage]) -> None:
    fast, mirror = tiers
    theirs = commit(mirror, 5, run="branch-b")  # same step, same name, other content
    copied = mirror_of(fast, mirror, commit(fast, 5))
    assert copied.name == "ckpt-step000000005-v2.bin"
    assert [r.name for r in read_manifest(mirror)] == [theirs.name, copied.name]
    assert (mirror.root / theirs.name).read_bytes().startswith(b"branch-b:5")


def test_a_source_that_changed_after_its_commit_is_refused_and_nothing_is_left(
    tiers: tuple[LocalStorage, LocalStorage],
) -> None:
    fast, mirror = tiers
    record = commit(fast, 3)
    (fast.root / record.name).write_bytes(b"torn")
    with pytest.raises(ValueError, match="changed after it was committed"):
        copy_checkpoint(fast, mirror, record)
    assert read_manifest(mirror) == [] and sorted(p.name for p in mirror.root.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "taken", "expected"),
    [
        ("ckpt-step000000005.ckpt", set(), "ckpt-step000000005.ckpt"),
        ("ckpt-step000000005.ckpt", {"ckpt-step000000005.ckpt"}, "ckpt-step000000005-v2.ckpt"),
        ("ckpt-step000000005-v2.ckpt", {"ckpt-step000000005-v2.ckpt"}, "ckpt-step000000005-v3.ckpt"),
        ("ckpt-step000000005.weights.h5", {"ckpt-step000000005.weights.h5"}, "ckpt-step000000005-v2.weights.h5"),
        ("model.bin", {"model.bin", "model-v2.bin"}, "model-v3.bin"),
        ("model", {"model"}, "model-v2"),
    ],
)
def test_free_name(name: str, taken: set[str], expected: str) -> None:
    assert free_name(name, taken.__contains__) == expected


# -- which checkpoint a resume takes ------------------------------------------------------------
#
# Each history is a list of events: ("fast", step) commits a checkpoint in the fast tier,
# ("mirror", step) copies the fast tier's checkpoint of that step to the mirror, ("remote", step)
# commits one in the mirror only (another node's work of the same run), ("other-run", step)
# commits one of another run in the fast tier, ("drop-fast", step) is the fast tier's retention
# of that step, ("wipe", 0) loses the fast tier (a new node), ("corrupt-fast"/"corrupt-mirror",
# step) damages that tier's file of the step.

HISTORIES = [
    ("both empty", [], None),
    ("a new mirror: the fast tier's newest", [("fast", 2), ("fast", 4)], ("fast", 4)),
    ("a fresh node: the mirror's newest", [("remote", 3), ("remote", 6)], ("mirror", 6)),
    ("the fast tier is ahead of the mirror", [("fast", 2), ("mirror", 2), ("fast", 4), ("fast", 6)], ("fast", 6)),
    ("both hold the same newest: the local copy", [("fast", 2), ("mirror", 2)], ("fast", 2)),
    (
        "this node trained the run further than another node's newest upload: its own later step",
        [("fast", 2), ("mirror", 2), ("fast", 8), ("remote", 4)],
        ("fast", 8),
    ),
    (
        "another node trained the run further than this one: the mirror's newest",
        [("fast", 2), ("mirror", 2), ("fast", 4), ("remote", 6)],
        ("mirror", 6),
    ),
    (
        "uploads lagged and retention dropped the mirror's newest here: this node's newest",
        [("fast", 2), ("mirror", 2), ("fast", 4), ("fast", 6), ("drop-fast", 2)],
        ("fast", 6),
    ),
    (
        "this node's later checkpoint is of another run: the mirror's newest",
        [("fast", 2), ("mirror", 2), ("other-run", 8), ("drop-fast", 2)],
        ("mirror", 2),
    ),
    (
        "the fast tier's newer checkpoint is corrupt: the local copy of the mirror's newest",
        [("fast", 2), ("mirror", 2), ("fast", 4), ("corrupt-fast", 4)],
        ("fast", 2),
    ),
    (
        "both local files are corrupt: the mirror's copy",
        [("fast", 2), ("mirror", 2), ("fast", 4), ("corrupt-fast", 4), ("corrupt-fast", 2)],
        ("mirror", 2),
    ),
    (
        "the mirror's newest is corrupt: its previous one, continued locally",
        [("fast", 2), ("mirror", 2), ("fast", 4), ("mirror", 4), ("fast", 6), ("corrupt-mirror", 4)],
        ("fast", 6),
    ),
    ("a new node after a wipe", [("fast", 2), ("mirror", 2), ("fast", 4), ("wipe", 0)], ("mirror", 2)),
]


def replay(fast: LocalStorage, mirror: LocalStorage, events: list[tuple[str, int]]) -> None:
    for kind, step in events:
        if kind == "fast":
            commit(fast, step)
        elif kind == "mirror":
            mirror_of(fast, mirror, next(r for r in read_manifest(fast) if r.step == step))
        elif kind == "remote":
            commit(mirror, step, run="run-a")
        elif kind == "other-run":
            commit(fast, step, run="run-b")
        elif kind == "drop-fast":  # retention: unlisted, then deleted
            records = read_manifest(fast)
            write_manifest(fast, [r for r in records if r.step != step])
            for r in records:
                if r.step == step:
                    (fast.root / r.name).unlink()
        elif kind == "wipe":
            for p in fast.root.iterdir():
                p.unlink()
        else:
            tier = fast if kind == "corrupt-fast" else mirror
            name = next(r.name for r in read_manifest(tier) if r.step == step)
            (tier.root / name).write_bytes(b"x" * 10)


@pytest.mark.parametrize(("story", "events", "expected"), HISTORIES, ids=[h[0] for h in HISTORIES])
def test_the_newest_of_either_tier(
    tiers: tuple[LocalStorage, LocalStorage], story: str, events: list[tuple[str, int]], expected: tuple[str, int] | None
) -> None:
    fast, mirror = tiers
    replay(fast, mirror, events)
    corrupt = any(kind == "corrupt-fast" for kind, _ in events)  # the mirror's files are not read here
    with pytest.warns(RuntimeWarning, match="skipping checkpoint") if corrupt else contextlib.nullcontext():
        record, tier = newest_of_tiers(fast, mirror, framework="toy")
    if expected is None:
        assert record is None and tier is None
        return
    assert record is not None and tier is (fast if expected[0] == "fast" else mirror)
    assert record.step == expected[1]


def test_other_frameworks_and_rejected_records_do_not_count(tiers: tuple[LocalStorage, LocalStorage]) -> None:
    fast, mirror = tiers
    commit(mirror, 9, framework="keras")
    commit(mirror, 7)
    commit(fast, 8)
    commit(fast, 10, framework="keras")
    record, tier = newest_of_tiers(fast, mirror, framework="toy")
    assert tier is fast and record is not None and record.step == 8  # the run, further here
    record, tier = newest_of_tiers(fast, mirror, framework="toy", accept=lambda r: r.step != 8)
    assert tier is mirror and record is not None and record.step == 7
    record, tier = newest_of_tiers(fast, mirror, framework="toy", accept=lambda r: r.step < 7)
    assert record is None and tier is None


def test_before_counts_commit_order_in_each_tier(tiers: tuple[LocalStorage, LocalStorage]) -> None:
    fast, mirror = tiers
    for step in (2, 4):
        mirror_of(fast, mirror, commit(fast, step))
    final = commit(fast, 6)
    mirror_of(fast, mirror, final)
    record, tier = newest_of_tiers(fast, mirror, framework="toy", before=final)
    assert tier is fast and record is not None and record.step == 4
    for p in fast.root.iterdir():  # a fresh node: the final checkpoint came from the mirror
        p.unlink()
    final_here = hydrate(mirror, fast, newest_of_tiers(fast, mirror, framework="toy")[0])  # type: ignore[arg-type]
    record, tier = newest_of_tiers(fast, mirror, framework="toy", before=final_here)
    assert tier is mirror and record is not None and record.step == 4


def test_hydrate_lists_the_copy_in_the_fast_tier_after_its_own_records(
    tiers: tuple[LocalStorage, LocalStorage],
) -> None:
    fast, mirror = tiers
    stale = commit(fast, 8, run="old-branch")
    remote = commit(mirror, 4)
    local = hydrate(mirror, fast, remote)
    assert same_checkpoint(local, remote) and local.seq == stale.seq + 1
    assert read_manifest(fast) == [stale, local]
    # once there, the next resume finds it in the fast tier: no second download
    assert newest_of_tiers(fast, mirror, framework="toy") == (local, fast)
    assert dataclasses.replace(local, name=remote.name, seq=remote.seq) == remote
