"""DDP on two real CPU processes (gloo) under faults: a signal that reaches one rank only, an
error raised on rank 0 only (a persist error, an unreadable manifest, a failed allocation).
Every rank must stop at the same step, nothing may hang.

Each run starts two processes that import torch and Lightning; the timeouts only turn a hang
into a failure, no assertion depends on time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autockpt_core import read_manifest, storage_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def run_ddp(tmp_path: Path, steps: int, fault: str) -> tuple[subprocess.CompletedProcess[str], dict[int, str]]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fault.lightning_ddp_script", str(tmp_path), str(steps), fault],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )
    results = {rank: (tmp_path / f"result-rank{rank}.txt").read_text() for rank in (0, 1)
               if (tmp_path / f"result-rank{rank}.txt").exists()}
    return proc, results


def test_sigterm_on_rank_1_only_stops_both_ranks_at_one_committed_step(tmp_path: Path) -> None:
    proc, results = run_ddp(tmp_path, 30, "sigterm-rank1@7")
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 143, report  # rank 0 got no signal, yet ends as preempted
    assert sorted(results) == [0, 1], report
    assert all("code=143" in line for line in results.values()), results
    # The signal arrived during step index 7: the boundary after it is global step 8.
    assert "stopped=8 saved=[5, 8]" in results[0] and "stopped=8 saved=[]" in results[1], results
    records = read_manifest(storage_for(tmp_path / "ck"))
    assert [r.step for r in records] == [5, 8] and records[-1].meta["reason"] == "preempted by SIGTERM"
    assert "SIGTERM received; checkpoint of step 8 committed" in proc.stdout


@pytest.mark.parametrize(
    "fault, steps, rank0, rank1, manifest_steps",
    [
        # (a persist error on rank 0: the contract suite, tests/contract/test_contract.py)
        # an unreadable manifest at resume (only rank 0 reads it)
        ("bad-manifest", 10, ("cannot read autockpt-manifest.json",), "cannot read autockpt-manifest.json", None),
        # rank 0's second snapshot fails while rank 1 is in the same checkpoint's collectives
        ("snapshot-oom", 30, ("MemoryError: cannot allocate the snapshot buffers",), "MemoryError", [5]),
        # a sharded model: rank 0's second dump fails; rank 1 must not start a save of its own
        # (its background thread would wait in DCP's collectives for rank 0 until the timeout)
        ("sharded-snapshot-oom", 30, ("MemoryError: cannot allocate the snapshot",), "MemoryError", [5]),
    ],
)
def test_an_error_on_rank_0_only_stops_every_rank_with_its_message(
    tmp_path: Path, fault: str, steps: int, rank0: tuple[str, ...], rank1: str, manifest_steps: list[int] | None
) -> None:
    proc, results = run_ddp(tmp_path, steps, fault)
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode != 0 and sorted(results) == [0, 1], report
    assert all(text in results[0] for text in rank0), results
    assert "PeerFailedError: autockpt: rank 0 stopped training" in results[1], results
    assert rank1 in results[1], results
    if manifest_steps is not None:
        assert [r.step for r in read_manifest(storage_for(tmp_path / "ck"))] == manifest_steps
        assert not list((tmp_path / "ck").glob(".autockpt-tmp*"))  # nothing of the failed checkpoint


def test_a_sharded_write_that_fails_on_rank_1_only_stops_every_rank_with_its_message(tmp_path: Path) -> None:
    """ModelParallelStrategy (FSDP2): rank 1's own shards of the second checkpoint fail (ENOSPC)
    in DCP's background thread, rank 0's are written. DCP's coordinator gets every rank's result
    before it writes ``.metadata``, so rank 0 never commits that checkpoint; every rank stops
    with rank 1's error (whichever rank reports it first), and the first checkpoint stays newest."""
    proc, results = run_ddp(tmp_path, 30, "sharded-rank1-write-error")
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode != 0 and sorted(results) == [0, 1], report
    for line in results.values():
        assert "code=1" in line and "rank 1: OSError: [Errno 28] No space left on device" in line, results
    assert "was not written" in results[0], results
    assert [r.step for r in read_manifest(storage_for(tmp_path / "ck"))] == [5]
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if not p.name.startswith(".autockpt-lock")) == [
        "autockpt-manifest.json",
        "autockpt-status.json",
        "ckpt-step000000005.ckpt",
    ]


def test_rank_0_profiles_the_checkpoint_stall_of_the_slowest_rank(tmp_path: Path) -> None:
    """Rank 1 spends 0.3 s more in every checkpoint; rank 0's own copy is milliseconds. The
    agreement carries each rank's blocked time, so rank 0's profiler (which sets the interval)
    counts the 0.3 s every rank waits, not its own copy alone."""
    proc, results = run_ddp(tmp_path, 30, "slow-rank1-save")
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0 and sorted(results) == [0, 1], report
    assert "saved=[5, 10, 15, 20, 25, 30]" in results[0], results
    stall = float(results[0].split("stall=")[1].split()[0])
    assert stall >= 0.3, results  # the sleep is a lower bound of the wait; no upper bound is asserted
    assert "stall=None" in results[1], results  # only rank 0 runs the session
