"""Measurement pieces shared by ``autockpt bench`` and its per-framework workers (numpy only).

Each configuration of the benchmark runs in its own interpreter (``python -m <worker> ...``)
so that its peak resident memory (``VmHWM``) belongs to that configuration alone. A worker
prints one line ``BENCH-RESULT <json>`` on stdout; :func:`parse_result` reads it back.

Physical floors, measured in the same run and directory as the methods they judge:

- memcpy floor: copying the state's bytes into an already allocated (and touched) buffer;
- raw write floor: writing the same bytes from memory to a new file in large unbuffered
  writes, then fsync.

State layout: a stack of square fully connected layers trained with Adam, so the training
state (parameters + two moment buffers, float32) is ``3 × 4 × params`` bytes; both the
Lightning and the Keras workers build it from :func:`mlp_layout`.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .storage import LocalStorage
from .tensorfile import write_tensor_file

RESULT_PREFIX = "BENCH-RESULT "
LAYERS = 4
STATE_COPIES = 3  # parameters, Adam's first and second moments


def mlp_layout(state_bytes: int, layers: int = LAYERS) -> tuple[int, int]:
    """``(width, layers)`` of square dense layers whose Adam training state is ~``state_bytes``."""
    params = max(1, state_bytes // (STATE_COPIES * 4))
    width = max(8, int(math.sqrt(params / layers)))
    return width, layers


def peak_rss_bytes() -> int:
    """This process's resident-memory high-water mark (VmHWM; ru_maxrss where /proc is absent)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    """Wall seconds of ``reps`` calls of ``fn``."""
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def memcpy_floor(nbytes: int, reps: int = 5) -> dict[str, float]:
    """Median seconds to copy ``nbytes`` into a preallocated buffer, and into fresh memory."""
    src = np.ones(max(1, nbytes // 8), dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page of the destination once
    prealloc = timed(lambda: np.copyto(dst, src), reps)
    fresh = timed(lambda: src.copy(), max(1, reps // 2))
    return {"memcpy_s": statistics.median(prealloc), "memcpy_fresh_s": statistics.median(fresh)}


def raw_write_floor(nbytes: int, directory: str, reps: int = 3, chunk: int = 64 << 20) -> float:
    """Median seconds to write ``nbytes`` to a new file in ``directory`` (unbuffered, 64 MiB
    writes) and fsync it. The file is removed afterwards."""
    data = memoryview(np.ones(max(1, nbytes // 8), dtype=np.float64)).cast("B")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "raw-write-floor.bin")

    def write() -> None:
        with open(path, "wb", buffering=0) as f:
            for start in range(0, len(data), chunk):
                view = data[start : start + chunk]
                done = 0
                while done < len(view):
                    done += f.write(view[done:]) or 0
            os.fsync(f.fileno())
        os.unlink(path)

    return statistics.median(timed(write, reps))


def safetensors_persist(nbytes: int, directory: str, reps: int = 3, tensors: int = 3 * LAYERS * 2) -> dict[str, float]:
    """Median seconds of autockpt's Keras-format persist (streaming safetensors writer through
    ``LocalStorage.write_atomic``: CRC-32, fsync, rename, directory fsync) of ``nbytes``."""
    per = max(1, nbytes // (4 * tensors))
    arrays = {f"t{i}": np.full(per, i, dtype=np.float32) for i in range(tensors)}
    storage = LocalStorage(directory)
    name = "persist-floor.safetensors"
    size = 0

    def write() -> None:
        nonlocal size
        size = storage.write_atomic(name, lambda f: write_tensor_file(f, arrays)).size
        storage.delete(name)

    seconds = statistics.median(timed(write, reps))
    return {"safetensors_persist_s": seconds, "safetensors_bytes": float(size)}


def step_times(marks: dict[int, float], warm: int, every: int) -> dict[str, Any]:
    """Step-time figures from the time marks at the end of each step.

    ``mean_step_s``: (last mark - mark at ``warm``) / steps. ``intervals_s``: durations of the
    consecutive windows of ``every`` steps after ``warm``, each holding exactly one checkpoint's
    stall; ``median_step_s`` = their median / ``every``, robust to a load spike on a shared
    machine.
    """
    steps = sorted(marks)
    if warm not in marks or steps[-1] <= warm:
        return {"mean_step_s": None, "median_step_s": None, "intervals_s": []}
    intervals = [
        marks[warm + (k + 1) * every] - marks[warm + k * every]
        for k in range((steps[-1] - warm) // every)
        if warm + (k + 1) * every in marks
    ]
    return {
        "mean_step_s": (marks[steps[-1]] - marks[warm]) / (steps[-1] - warm),
        "median_step_s": statistics.median(intervals) / every if intervals else None,
        "intervals_s": intervals,
    }


def stall_figures(
    hooks: list[tuple[float, float]], marks: dict[int, float], warm: int, every: int
) -> dict[str, Any]:
    """Per-checkpoint stall from the method's timed hook calls ``(start, seconds)``.

    Hook time is summed per checkpoint interval (the windows of :func:`step_times`, each
    holding one checkpoint). ``stall_s``: the median interval (steady state);
    ``stall_first_s``: the first (it includes allocating the reusable buffers where the
    method allocates them at its first checkpoint); ``stall_mean_s``: the mean.
    """
    bounds = [marks[warm + k * every] for k in range(len(marks)) if warm + k * every in marks]
    per_interval = [
        sum(sec for start, sec in hooks if lo <= start < hi) for lo, hi in zip(bounds, bounds[1:])
    ]
    if not per_interval:
        return {"stall_s": None, "stall_first_s": None, "stall_mean_s": None, "checkpoints": 0}
    return {
        "stall_s": statistics.median(per_interval),
        "stall_first_s": per_interval[0],
        "stall_mean_s": statistics.mean(per_interval),
        "stall_max_s": max(per_interval),
        "checkpoints": len(per_interval),
    }


def emit(result: dict[str, Any]) -> None:
    """Print the worker's result line (the last thing a worker prints)."""
    result.setdefault("peak_rss_bytes", peak_rss_bytes())
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The result a worker printed, or None if it printed none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    return None


def floor_main(argv: list[str] | None = None) -> int:
    """Worker: ``python -m autockpt_core.bench --bytes N --dir D [--reps R]``: the floors."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m autockpt_core.bench")
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"case": "floor", "state_bytes": args.bytes}
    result.update(memcpy_floor(args.bytes, reps=max(3, args.reps)))
    result["raw_write_s"] = raw_write_floor(args.bytes, args.dir, reps=args.reps)
    result.update(safetensors_persist(args.bytes, args.dir, reps=args.reps))
    result["raw_write_after_s"] = raw_write_floor(args.bytes, args.dir, reps=args.reps)  # drift check
    emit(result)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(floor_main())
