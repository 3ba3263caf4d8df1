"""Lightning under real faults: SIGKILL in the snapshot, in the persist, at a training step,
SIGTERM (emergency checkpoint, exit 143), then a rerun of the same command; the final weights
must equal, bit for bit, those of an uninterrupted run without the callback.

With a node-local ``dirpath`` and an S3 mirror (a real moto server), the job also moves
between two "nodes" (disks). Dropout, shuffling, a per-step LR schedule and validation are on. Each process imports
torch and Lightning (a few seconds), so CI runs one chain of faults; more loaders, kills and
seeds are behind ``slow``.
"""

from __future__ import annotations

import json
import random
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from autockpt_core import read_manifest, storage_for
from tests.fault.harness import assert_weights_equal, run_baseline, run_until_done
from tests.fault.lightning_script import train, weights_of

COMMAND = [sys.executable, "-m", "tests.fault.lightning_script"]

pytestmark = pytest.mark.integration


def test_kills_in_snapshot_persist_and_step_plus_sigterm_end_bitwise_equal(tmp_path: Path) -> None:
    args = ["--loader", "stateful", "--val", "--epochs", "3", "--every", "2"]
    # The baseline runs in this process (saves a Lightning start-up; the script is the same code,
    # one thread, CPU: a subprocess baseline is bitwise equal, as the slow tests check).
    model, _, _ = train(str(tmp_path / "baseline"), baseline=True, loader="stateful", val=True, epochs=3)
    expected = weights_of(model)
    plans = [
        {"phase": "snapshot", "nth": 3},  # SIGKILL inside dump_checkpoint + copy (phase 1)
        {"phase": "persist", "nth": 2},  # SIGKILL with the checkpoint file half written
        {"phase": "step", "at": 20, "action": "sigterm"},  # preemption: emergency checkpoint, exit 143
        {"phase": "step", "at": 30},  # SIGKILL in the middle of a training step
    ]
    result = run_until_done(COMMAND, tmp_path / "ck", tmp_path / "w.npz", plans=plans, extra_args=args)
    result.assert_faults_happened()
    assert [a.returncode for a in result.attempts] == [-9, -9, 143, -9, 0], result.report()
    assert result.attempts[2].newest_step == 21  # the step the signal arrived in (21 is not a multiple of 2)
    assert "SIGTERM received; checkpoint of step 21 committed" in result.attempts[2].output
    assert "resuming from step 21" in result.attempts[3].output
    steps = [a.newest_step or 0 for a in result.attempts]
    assert steps == sorted(steps), result.report()
    assert_weights_equal(result.weights, expected)


def test_kills_while_the_persist_process_writes_and_commits_end_bitwise_equal(tmp_path: Path) -> None:
    """persist_mode="process": the checkpoint file is written by the persist process. A kill
    there (half the file written) takes the training process down with it; a kill at the
    commit hits the training process, whose writer thread commits what the child wrote."""
    args = ["--loader", "stateful", "--epochs", "2", "--every", "3", "--persist-mode", "process"]
    model, _, _ = train(str(tmp_path / "baseline"), baseline=True, loader="stateful", epochs=2)
    expected = weights_of(model)
    plans = [
        {"phase": "persist", "nth": 2},  # SIGKILL of the job while the persist process writes
        {"phase": "commit", "nth": 2},  # SIGKILL with the file in place, the manifest not yet written
    ]
    result = run_until_done(COMMAND, tmp_path / "ck", tmp_path / "w.npz", plans=plans, extra_args=args)
    result.assert_faults_happened()
    assert [a.returncode for a in result.attempts] == [-9, -9, 0], result.report()
    assert result.attempts[0].events[0].get("in_persist_process") is True, result.report()
    assert result.attempts[0].newest_step == 3, result.report()  # the second file was half written
    assert not list((tmp_path / "ck").glob("*.tmp*")), sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert_weights_equal(result.weights, expected)


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["stateful", "sampler", "iterable"])
@pytest.mark.parametrize("seed", [0, 1])
def test_many_random_faults_end_bitwise_equal(tmp_path: Path, loader: str, seed: int) -> None:
    rng = random.Random(f"{loader}-{seed}")
    args = ["--loader", loader, "--val", "--epochs", "4", "--every", str(rng.randint(1, 3))]
    expected = run_baseline(COMMAND, tmp_path, extra_args=args)
    plans: list[dict[str, object]] = [
        {"phase": "snapshot", "nth": rng.randint(1, 3)},
        {"phase": "persist", "nth": rng.randint(1, 3)},
        {"phase": "commit", "nth": rng.randint(1, 3)},
        {"phase": "retention", "nth": 1},
        {"phase": "step", "at": rng.randrange(5, 40), "action": "sigterm"},
        {"phase": "persist", "nth": 1, "action": rng.choice(["enospc", "eacces"])},
    ]
    rng.shuffle(plans)
    result = run_until_done(
        COMMAND,
        tmp_path / "ck",
        tmp_path / "w.npz",
        plans=plans,
        kill_after=[rng.uniform(4.0, 9.0) for _ in range(2)],  # lands after the imports, at a random point
        extra_args=args,
        require_all=False,
    )
    result.assert_faults_happened()
    assert sum(a.returncode == -9 for a in result.attempts) >= 3, result.report()
    assert_weights_equal(result.weights, expected)


@pytest.mark.slow
def test_in_process_baseline_equals_the_subprocess_baseline(tmp_path: Path) -> None:
    args = ["--loader", "stateful", "--val", "--epochs", "3", "--every", "2"]
    model, _, _ = train(str(tmp_path / "baseline"), baseline=True, loader="stateful", val=True, epochs=3)
    assert_weights_equal(weights_of(model), run_baseline(COMMAND, tmp_path, extra_args=args))


def test_sigterm_in_the_sanity_check_before_the_first_checkpoint_and_in_validation(tmp_path: Path) -> None:
    """SIGTERM at three more points of fit(), each in a real process: every run ends 143 with
    the work up to the signal committed (never exit 0), and the final weights are exact."""
    args = ["--loader", "stateful", "--val", "--epochs", "3", "--every", "5", "--sanity", "2"]
    model, _, _ = train(str(tmp_path / "baseline"), baseline=True, loader="stateful", val=True, epochs=3)
    expected = weights_of(model)
    plans = [
        {"phase": "sanity", "nth": 1, "action": "sigterm"},  # before training: nothing to save
        {"phase": "step", "at": 1, "action": "sigterm"},  # before the first periodic checkpoint (5)
        {"phase": "val", "nth": 1, "action": "sigterm"},  # validation after step 12: acted on at once
    ]
    result = run_until_done(COMMAND, tmp_path / "ck", tmp_path / "w.npz", plans=plans, extra_args=args)
    result.assert_faults_happened()
    assert [a.returncode for a in result.attempts] == [143, 143, 143, 0], result.report()
    assert [a.newest_step for a in result.attempts[:3]] == [None, 2, 12], result.report()
    assert "SIGTERM received; nothing trained since step 0" in result.attempts[0].output
    assert_weights_equal(result.weights, expected)


DDP_ARGS = ["--loader", "stateful", "--val", "--epochs", "4", "--every", "2", "--devices", "2"]
SHARDED_ARGS = [*DDP_ARGS, "--sharded"]


@pytest.mark.parametrize("sharded", [False, True], ids=["ddp", "sharded"])
def test_two_ranks_killed_as_a_job_and_preempted_on_one_rank_end_bitwise_equal(tmp_path: Path, sharded: bool) -> None:
    """2 CPU ranks (gloo), 6 steps per epoch: each kill takes the whole job (every rank and its
    threads at once, as torchrun tears a job down), the preemption signal reaches rank 1 only.
    Rank 1's dropout masks and data shard count in the final weights, so its generators and
    loader position must be restored as exactly as rank 0's.

    ``ddp``: DDP, rank 0 writes each checkpoint file. ``sharded``: ModelParallelStrategy with
    FSDP2 over both ranks: each rank holds half of every weight and of Adam's state and writes
    its own shards, and every resume verifies every rank's file."""
    args = SHARDED_ARGS if sharded else DDP_ARGS
    expected = run_baseline(COMMAND, tmp_path, extra_args=args)
    plans = [
        {"phase": "snapshot", "nth": 3},  # inside dump_checkpoint on both ranks (step 7: 6 ends an epoch)
        # the checkpoint of step 8 (7 is done): DDP: rank 0's file half written; sharded: both
        # ranks' shards written, the directory not yet committed
        {"phase": "persist", "nth": 2},
        {"phase": "step", "at": 8, "action": "sigterm", "rank": 1},  # only rank 1 is signalled
        {"phase": "step", "at": 15, "rank": 1},  # rank 1 kills the job in the middle of a step
    ]
    result = run_until_done(
        COMMAND,
        tmp_path / "ck",
        tmp_path / "w.npz",
        plans=plans,
        kill_after=[random.Random(0).uniform(4.0, 9.0)],  # the job, from outside, at an unplanned point
        extra_args=args,
    )
    result.assert_faults_happened()
    codes = [a.returncode for a in result.attempts]
    assert codes[:4] == [-9, -9, 143, -9], result.report()
    # then the external kill (it may land after the end: OUT written, nothing left to rerun)
    assert all(a.returncode == 0 or a.killed_externally for a in result.attempts[4:]), result.report()
    assert [a.newest_step for a in result.attempts[:3]] == [4, 7, 9], result.report()
    # step 14's checkpoint is committed in the background: the kill in step 15 may come first
    assert result.attempts[3].newest_step in (13, 14), result.report()
    assert all(e["rank"] == 1 for a in result.attempts[2:4] for e in a.events), result.report()
    assert "SIGTERM received; checkpoint of step 9 committed" in result.attempts[2].output
    assert "resuming from step 9" in result.attempts[3].output
    assert_weights_equal(result.weights, expected)
    left = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert not [name for name in left if name.startswith(".autockpt-tmp")], left  # interrupted writes removed
    newest = read_manifest(storage_for(tmp_path / "ck"))[-1]
    if sharded:
        listings = {".autockpt-files-rank0.json", ".autockpt-files-rank1.json"}  # each rank's own checksums
        assert set(newest.files or {}) == {"__0_0.distcp", "__1_0.distcp", ".metadata", "meta.pt", *listings}
    else:
        assert newest.files is None and (tmp_path / "ck" / newest.name).is_file()


class Nodes:
    """Attempts that run on two nodes in turn, A, B, A, B ...: each node's local disk is its own
    ``dirpath`` (moved into place before its attempt), so B starts with an empty fast tier and
    A comes back to a disk the job has moved on from."""

    def __init__(self, dirpath: Path) -> None:
        self.dirpath = dirpath
        self.disks = [dirpath.with_name("disk-a"), dirpath.with_name("disk-b")]
        self.current: int | None = None

    def __call__(self, attempt: int) -> None:
        if self.current is not None and self.dirpath.exists():
            self.dirpath.rename(self.disks[self.current])
        self.current = attempt % 2
        if self.disks[self.current].exists():
            self.disks[self.current].rename(self.dirpath)


def test_a_node_local_tier_with_an_s3_mirror_survives_lost_and_stale_nodes_bitwise(
    tmp_path: Path, s3_server: Any
) -> None:
    """``dirpath`` is each node's local disk, ``mirror`` a bucket on a real S3-compatible server
    (moto, 127.0.0.1). Node B starts empty and must resume from the mirror; node A comes back
    with its own older checkpoints and must take the mirror's newer one (B's work), though A's
    disk holds checkpoints the mirror never saw."""
    mirror = s3_server.url(f"lightning-{uuid.uuid4().hex[:8]}")
    args = ["--loader", "stateful", "--val", "--epochs", "3", "--every", "2",
            "--mirror", mirror, "--storage-options", json.dumps(s3_server.storage_options)]  # fmt: skip
    model, _, _ = train(str(tmp_path / "baseline"), baseline=True, loader="stateful", val=True, epochs=3)
    expected = weights_of(model)
    plans = [
        {"phase": "step", "at": 6, "action": "sigterm"},  # node A: preempted; step 7 reaches the bucket
        {"phase": "step", "at": 20, "action": "sigterm"},  # node B, from the bucket's step 7: step 21 too
        {"phase": "persist", "nth": 3},  # node A, from the bucket's step 21: SIGKILL mid-write
    ]
    nodes = Nodes(tmp_path / "ck")
    result = run_until_done(COMMAND, nodes.dirpath, tmp_path / "w.npz", plans=plans, extra_args=args,
                            before_attempt=nodes)  # fmt: skip
    result.assert_faults_happened()
    assert [a.returncode for a in result.attempts] == [143, 143, -9, 0], result.report()
    on_a, on_b, back_on_a, _ = (a.output for a in result.attempts)
    assert "SIGTERM received; checkpoint of step 7 committed" in on_a and "resuming" not in on_a
    said = re.search(r"ckpt-step000000007\.ckpt\) \d+\.\d s after the signal \(grace_period 30 s\), and in the mirror (\S+); "
                     r"exiting with status 143", on_a)
    assert said is not None and said.group(1) == mirror, on_a[-2000:]
    # B's disk is empty: the bucket's checkpoint is copied in first
    assert f"resuming from step 7: {nodes.dirpath}/ckpt-step000000007.ckpt (copied from the mirror {mirror})" in on_b
    assert "SIGTERM received; checkpoint of step 21 committed" in on_b
    # A's disk ends at step 7 (its own); the bucket's step 21 (B's) is newer and wins
    assert f"resuming from step 21: {nodes.dirpath}/ckpt-step000000021.ckpt (copied from the mirror {mirror})" in back_on_a
    newest_local = read_manifest(storage_for(str(nodes.dirpath)))[-1]
    newest_remote = read_manifest(storage_for(mirror, s3_server.storage_options))[-1]
    assert (newest_remote.step, newest_remote.checksum) == (newest_local.step, newest_local.checksum)  # finish() waited
    assert_weights_equal(result.weights, expected)
