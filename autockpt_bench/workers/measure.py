"""Measurement pieces shared by ``autockpt bench`` and its per-framework workers (numpy only).

Each configuration of the benchmark runs in its own interpreter (``python -m <worker> ...``)
so that its peak resident memory (``VmHWM``) belongs to that configuration alone. A worker
prints one line ``BENCH-RESULT <json>`` on stdout; :func:`parse_result` reads it back.

The physical floors the methods are judged against are measured by :mod:`.floors` in the
same run and directory.

State layout: a stack of square fully connected layers trained with Adam, so the training
state (parameters + two moment buffers, float32) is ``3 × 4 × params`` bytes; both the
Lightning and the Keras workers build it from :func:`mlp_layout`.
"""

from __future__ import annotations

import json
import math
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

RESULT_PREFIX = "BENCH-RESULT "
LAYERS = 4
STATE_COPIES = 3  # parameters, Adam's first and second moments


def thread_caps(threads: int) -> dict[str, str]:
    """Environment variables that cap BLAS/OpenMP/TensorFlow threads at ``threads`` (empty for
    0: the frameworks' defaults). Set before a framework is imported: the bench and the study
    put them in their workers' environment."""
    if threads <= 0:
        return {}
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "TF_NUM_INTRAOP_THREADS": n, "TF_NUM_INTEROP_THREADS": "1"}


#: glibc's allocator with fixed thresholds, for every study worker alike. With its default,
#: dynamic threshold an allocation above 128 KiB is mapped and unmapped each time (page faults
#: at every step for the activations) until a large free raises the threshold: a process
#: then trains faster after its first checkpoint buffer is freed than a process that never
#: frees one (Lightning small on the 2-core machine: median step 9.7-11.2 ms without, 7.8-8.5
#: ms after a 12.5 MB free or with these values; docs/comparison.md). 32 MiB is the largest
#: threshold the dynamic rule reaches; trimming at twice that, as the dynamic rule does.
FIXED_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}


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


def record_persist_windows(windows: list[tuple[float, float]]) -> None:
    """Append ``(start, end)`` of every background persist in this process to ``windows``
    (wraps ``CheckpointWriter._run``, which spans a whole persist in either persist mode)."""
    from autockpt_core.persist.writer import CheckpointWriter

    original = CheckpointWriter._run

    def timed_run(self: Any, job: Any) -> None:
        start = time.perf_counter()
        try:
            original(self, job)
        finally:
            windows.append((start, time.perf_counter()))

    CheckpointWriter._run = timed_run  # type: ignore[method-assign]


def overlap_figures(
    marks: dict[int, float], hooks: list[tuple[float, float]], windows: list[tuple[float, float]], warm: int
) -> dict[str, Any]:
    """Step times of iterations that overlapped a background persist vs clean ones.

    A step's time is the gap between its end mark and the previous one minus the hook time
    in between (a checkpoint's own stall is not counted). A step overlaps when a persist
    window intersects the part of that gap after the hooks. ``overlap_ratio``: mean
    overlapped ÷ median clean.
    """
    steps = sorted(k for k in marks if k > warm and k - 1 in marks)
    clean: list[float] = []
    loaded: list[float] = []
    for k in steps:
        lo, hi = marks[k - 1], marks[k]
        inside = [(start, sec) for start, sec in hooks if lo <= start < hi]
        compute_from = max([start + sec for start, sec in inside], default=lo)
        duration = hi - lo - sum(sec for _start, sec in inside)
        overlapped = any(start < hi and end > compute_from for start, end in windows)
        (loaded if overlapped else clean).append(duration)
    clean_s = statistics.median(clean) if clean else None
    loaded_s = statistics.mean(loaded) if loaded else None
    return {
        "clean_step_s": clean_s,
        "overlapped_step_s": loaded_s,
        "overlapped_steps": len(loaded),
        "overlap_ratio": loaded_s / clean_s if clean_s and loaded_s else None,
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
