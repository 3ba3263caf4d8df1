"""Floors worker of ``autockpt bench``: the physical limits a checkpoint is judged against.

``python -m autockpt_bench.workers.floors --bytes N --dir D [--reps R]`` measures, in the
benchmark's own directory: the memcpy floor (copy into an allocated, touched buffer), the raw
write floor (large unbuffered writes + fsync, before and after, as a drift check) and
autockpt's own safetensors persist of the same bytes; prints one ``BENCH-RESULT`` line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

import numpy as np

from autockpt_core.persist.storage import LocalStorage
from autockpt_core.persist.tensorfile import write_tensor_file

from .measure import LAYERS, emit, timed


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


def floor_main(argv: list[str] | None = None) -> int:
    """Worker: ``python -m autockpt_bench.workers.floors --bytes N --dir D [--reps R]``: the floors."""
    parser = argparse.ArgumentParser(prog="python -m autockpt_bench.workers.floors")
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
