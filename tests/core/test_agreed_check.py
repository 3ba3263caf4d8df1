"""A checkpoint every process wrote (a sharded model's file set) is verified at a resume by every
process, each its own share of the files, with the answers agreed: threads stand in for the
processes (``tests.core.policy.test_process_group.ThreadGroup``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autockpt_core import CheckpointSession, Config
from autockpt_core.agreed_check import AgreedCheck
from autockpt_core.persist import LocalStorage, read_manifest
from autockpt_core.persist.checksum import checksum_stream
from autockpt_core.persist.file_set import share_of
from autockpt_core.persist.manifest import MANIFEST_NAME, CheckpointRecord, write_manifest
from tests.collectives import ThreadGather, on_threads
from tests.core.policy.test_process_group import ThreadGroup

SHARDS = ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp", ".metadata", "meta.pt", ".autockpt-files-rank0.json"]


@pytest.mark.parametrize(
    ("index", "count", "expected"),
    [
        (0, 1, sorted(SHARDS)),
        (0, 2, [".autockpt-files-rank0.json", "__0_0.distcp", "__2_0.distcp"]),  # rank 2's shard: spread
        (1, 2, [".metadata", "__1_0.distcp", "meta.pt"]),
        (2, 3, ["__2_0.distcp", "meta.pt"]),  # its own shard, and the third of the spread files
        (3, 4, []),  # more processes than files to spread: nothing left for process 3
    ],
)
def test_each_rank_verifies_its_own_shards_and_a_share_of_the_rest(index: int, count: int, expected: list[str]) -> None:
    files = {name: [1, "0"] for name in SHARDS}
    assert sorted(share_of(files, index, count)) == expected


@given(
    names=st.sets(st.from_regex(r"(__[0-9]{1,2}_[0-9]\.distcp|[a-z.]{1,8}|sub/__1_0\.distcp)", fullmatch=True), max_size=30),
    count=st.integers(1, 8),
)
def test_every_file_is_verified_by_exactly_one_process(names: set[str], count: int) -> None:
    files = {name: [0, "0"] for name in names}
    shares = [set(share_of(files, i, count)) for i in range(count)]
    assert set().union(*shares) == names
    assert sum(len(share) for share in shares) == len(names)


def write_file_set(root: Path, name: str, step: int, count: int) -> CheckpointRecord:
    directory = root / name
    directory.mkdir(parents=True)
    files: dict[str, list[Any]] = {}
    for relative in [*(f"__{rank}_0.distcp" for rank in range(count)), ".metadata", "meta.pt"]:
        data = f"{name}/{relative}".encode() * 100
        (directory / relative).write_bytes(data)
        files[relative] = [len(data), checksum_stream(io.BytesIO(data))[0]]
    return CheckpointRecord(
        name=name, step=step, epoch=0, size=0, checksum="0", algorithm="crc32", created=float(step),
        framework="np", seq=step, files=files,
    )  # fmt: skip


def resume_on_threads(root: Path, count: int) -> list[Any]:
    """Process 0 resumes through a session with the agreed check; the others follow."""
    gather = ThreadGather(count)
    checks: dict[int, AgreedCheck] = {}

    def run(index: int) -> Any:
        agreed = checks[index] = AgreedCheck(ThreadGroup(index, gather), LocalStorage(root))
        if index != 0:
            agreed.follow()
            return agreed.rounds
        session = CheckpointSession(Config(dirpath=str(root), verbose=False), framework="np", suffix=".d")
        try:
            return session.resume_record(check=agreed.check)
        finally:
            agreed.done()
            session.close()

    return on_threads(count, run)


def test_a_shard_corrupt_on_one_rank_makes_every_rank_fall_back_to_the_previous_checkpoint(tmp_path: Path) -> None:
    records = [write_file_set(tmp_path, f"ckpt-{step}.d", step, 3) for step in (10, 20)]
    write_manifest(LocalStorage(tmp_path), records)
    (tmp_path / "ckpt-20.d" / "__2_0.distcp").write_bytes(b"torn")  # only process 2 reads it
    with pytest.warns(RuntimeWarning, match=r"ckpt-20\.d \(step 20\).*__2_0\.distcp.*checked by process 2"):
        newest, rounds_1, rounds_2 = resume_on_threads(tmp_path, 3)
    assert isinstance(newest, CheckpointRecord) and newest.step == 10
    assert rounds_1 == rounds_2 == 2  # both candidates, checked together


def test_intact_file_sets_resume_the_newest_after_one_round(tmp_path: Path) -> None:
    records = [write_file_set(tmp_path, f"ckpt-{step}.d", step, 2) for step in (10, 20)]
    write_manifest(LocalStorage(tmp_path), records)
    newest, rounds = resume_on_threads(tmp_path, 2)
    assert isinstance(newest, CheckpointRecord) and newest.step == 20 and rounds == 1
    assert [r.step for r in read_manifest(LocalStorage(tmp_path))] == [10, 20]


def test_an_error_on_process_0_before_any_check_releases_the_others(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME).write_text("{not json")  # the resume raises before checking anything
    newest, rounds = resume_on_threads(tmp_path, 2)
    assert isinstance(newest, ValueError) and rounds == 0
