"""What a mirror costs: upload and fresh-node download times, and the slowdown of the steps
that run while an upload is in flight.

The mirror is a real S3-compatible server (``moto.server``, started as its own process on
127.0.0.1, as the tests do; run this from a checkout with ``autockpt[s3]`` and ``moto[server]``
installed). For each size it commits one checkpoint file in a local fast tier, then:

- times a "training step" (a fixed numpy matmul on one thread) while nothing runs in the
  background, and again while the mirror thread uploads that checkpoint (what the user pays:
  the upload shares the process and its GIL with training);
- reports the upload's time and rate, the local write's, and the time a fresh node takes to
  copy the checkpoint back (``hydrate``, the start of a resume on an empty disk).

    python examples/mirror_overhead.py --sizes 64 256 --json mirror.json
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.s3_server, from a checkout

from autockpt_core.persist import LocalStorage, read_manifest  # noqa: E402
from autockpt_core.persist.manifest import CheckpointRecord, next_seq, write_manifest  # noqa: E402
from autockpt_core.persist.mirror import Mirror  # noqa: E402
from autockpt_core.persist.storage import storage_for  # noqa: E402
from autockpt_core.persist.tiers import hydrate  # noqa: E402

MiB = 2**20


def commit_file(storage: LocalStorage, size: int) -> tuple[CheckpointRecord, float]:
    """A committed checkpoint of ``size`` random bytes in ``storage``; returns it and the write's seconds."""
    payload = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes()
    start = time.perf_counter()
    result = storage.write_atomic(f"ckpt-step{size // MiB:09d}.bin", lambda f: f.write(payload))
    seconds = time.perf_counter() - start
    records = read_manifest(storage)
    record = CheckpointRecord.from_write(result, size // MiB, 0, "bench", seq=next_seq(records), run="bench")
    write_manifest(storage, records + [record])
    return record, seconds


def step_times(work: np.ndarray, until: Any, at_least: int) -> list[float]:
    """Time fixed steps while ``until()`` is False (and at least ``at_least`` of them)."""
    times = []
    while len(times) < at_least or not until():
        start = time.perf_counter()
        for _ in range(4):
            work @ work
        times.append(time.perf_counter() - start)
    return times


def measure(size_mib: int, server: Any, root: Path) -> dict[str, Any]:
    fast = LocalStorage(root / f"fast-{size_mib}")
    url = server.url(f"bench-{uuid.uuid4().hex[:8]}")
    target = storage_for(url, server.storage_options)
    record, local_s = commit_file(fast, size_mib * MiB)
    work = np.random.default_rng(1).standard_normal((384, 384)).astype(np.float32)
    quiet = step_times(work, lambda: True, at_least=200)
    mirror = Mirror(fast, target, keep_last=2)
    mirror.submit(record)
    during = step_times(work, lambda: not mirror.busy, at_least=5)
    mirror.wait()
    upload_s = mirror.last_upload_s or float("nan")
    fresh = LocalStorage(root / f"fresh-{size_mib}")
    start = time.perf_counter()
    hydrate(target, fresh, read_manifest(target)[-1])
    download_s = time.perf_counter() - start
    q, d = statistics.median(quiet), statistics.median(during)
    return {
        "size_mib": size_mib,
        "local_write_s": local_s,
        "upload_s": upload_s,
        "upload_gb_s": size_mib * MiB / upload_s / 1e9,
        "fresh_node_copy_s": download_s,
        "step_quiet_ms": q * 1e3,
        "step_during_upload_ms": d * 1e3,
        "slowdown_pct": (d / q - 1) * 100,
        "steps_during_upload": len(during),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256], help="checkpoint sizes in MiB")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    from tests.s3_server import S3Server

    server = S3Server().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [measure(size, server, Path(tmp)) for size in args.sizes]
    finally:
        server.stop()
    print("| size | local write | upload to the mirror | fresh-node copy | step quiet | step during upload |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['size_mib']} MiB | {r['local_write_s']:.2f} s | {r['upload_s']:.2f} s ({r['upload_gb_s']:.3f} GB/s) "
            f"| {r['fresh_node_copy_s']:.2f} s | {r['step_quiet_ms']:.2f} ms "
            f"| {r['step_during_upload_ms']:.2f} ms ({r['slowdown_pct']:+.0f}%, {r['steps_during_upload']} steps) |"
        )
    if args.json:
        machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}
        Path(args.json).write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
