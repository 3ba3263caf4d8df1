"""DDP on two real CPU processes (gloo) under faults: a signal that reaches one rank only, an
error raised on rank 0 only. Every rank must stop at the same step, nothing may hang.

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


def test_persist_error_on_rank_0_stops_every_rank_with_the_same_error(tmp_path: Path) -> None:
    proc, results = run_ddp(tmp_path, 30, "persist-error")
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode != 0 and sorted(results) == [0, 1], report
    assert "CheckpointWriteError" in results[0] and "No space left on device" in results[0], results
    assert "RankFailedError: autockpt: rank 0 stopped training" in results[1], results
    assert "No space left on device" in results[1], results
    assert [r.step for r in read_manifest(storage_for(tmp_path / "ck"))] == [5]  # the good one stays


def test_unreadable_manifest_at_resume_stops_both_ranks(tmp_path: Path) -> None:
    proc, results = run_ddp(tmp_path, 10, "bad-manifest")
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode != 0 and sorted(results) == [0, 1], report
    assert "cannot read autockpt-manifest.json" in results[0], results
    assert "RankFailedError: autockpt: rank 0 stopped training" in results[1], results
    assert "cannot read autockpt-manifest.json" in results[1], results


def test_out_of_memory_in_rank_0s_snapshot_stops_both_ranks(tmp_path: Path) -> None:
    proc, results = run_ddp(tmp_path, 30, "snapshot-oom")
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode != 0 and sorted(results) == [0, 1], report
    assert "MemoryError: cannot allocate the snapshot buffers" in results[0], results
    assert "RankFailedError: autockpt: rank 0 stopped training" in results[1], results
    assert "MemoryError" in results[1], results
    assert [r.step for r in read_manifest(storage_for(tmp_path / "ck"))] == [5]
