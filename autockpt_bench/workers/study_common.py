"""Framework-free pieces of the study workers (``lightning_study``, ``keras_study``).

Both workers' ``main`` is :func:`serve`: the case (train, restore, goodput) and the spec from
the command line, goodput's event log started, then the framework's ``run_case``.
Call order in a ``train`` case: :func:`setup_threads` first; a :class:`Timeline` records, on the
training thread, the end of every step (:meth:`Timeline.step_done`), the time spent in the
method's hooks (:func:`time_hooks` wraps them) and the steps after which the method took a
checkpoint (:meth:`Timeline.checkpoint`); at the end :meth:`Timeline.figures` gives the
protocol's step-time and blocked-time keys and :func:`finish_train` writes the reference
weights and the result and ends the process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..study.in_process_ab import Alternation
from ..study.protocol import EventLog, read_spec, write_json
from ..study.workloads import Workload
from .hooks import wrap_call
from .measure import peak_rss_bytes, thread_caps

CASES = ("train", "restore", "goodput")

RunCase = Callable[[str, Workload, dict[str, Any], dict[str, Any], "EventLog | None"], None]
"""``run_case(case, workload, method, spec, log)``: one case in this process (``log``: goodput's)."""


def serve(argv: list[str] | None, prog: str, started: float, run_case: RunCase) -> int:
    """A worker's command line: ``prog {train,restore,goodput} --spec SPEC.json``. ``started``:
    the process's start (``time.time()`` before the framework's import), goodput's "start"."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("case", choices=CASES)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    workload, method, spec = read_spec(args.spec)
    log = EventLog(spec["log"]) if args.case == "goodput" else None
    if log is not None:
        log.write("start", t=started)
    run_case(args.case, workload, method, spec, log)
    return 0


def setup_threads(threads: int) -> None:
    """Cap BLAS/OpenMP threads through the environment (before importing a framework), for a
    worker started without :func:`autockpt_bench.study.runner.worker_env` (by hand)."""
    os.environ.update(thread_caps(threads))


class Timeline:
    """What happened on the training thread, per global step (all times ``time.perf_counter()``)."""

    def __init__(self) -> None:
        self.step_end: dict[int, float] = {}
        self.hook_s: defaultdict[int, float] = defaultdict(float)
        self.checkpoint_steps: list[int] = []
        self.save_s: dict[int, float | None] = {}

    def step_done(self, step: int) -> None:
        """Global step ``step`` (1-based: the count of optimizer steps done) just ended."""
        self.step_end[step] = time.perf_counter()

    def add_hook_time(self, step: int, seconds: float) -> None:
        """``seconds`` spent in the method's hooks while global step ``step`` ran (or just after it)."""
        self.hook_s[step] += seconds

    def checkpoint(self, step: int, save_s: float | None = None) -> None:
        """The method took (started) a checkpoint of the state after step ``step``."""
        if step not in self.checkpoint_steps:
            self.checkpoint_steps.append(step)
        if save_s is not None or step not in self.save_s:
            self.save_s[step] = save_s

    def figures(self, warmup: int) -> dict[str, Any]:
        """``step_s``, ``step_s_median``, ``checkpoint_steps``, ``blocked_s``, ``save_s``,
        ``hook_s_median``.

        ``hook_s_median``: the median hook time of steps without a checkpoint (the hooks' fixed
        cost, paid in every step). Blocked time of a checkpoint after step ``s``: the hook time
        of steps ``s`` and ``s + 1`` (an overlapped copy is waited for in the next step) minus,
        for each, that fixed cost, never below 0.
        """
        steps = sorted(self.step_end)
        window = [s for s in steps if s > warmup and s - 1 in self.step_end]
        durations = [self.step_end[s] - self.step_end[s - 1] for s in window]
        last = steps[-1] if steps else 0
        step_s = (self.step_end[last] - self.step_end[warmup]) / (last - warmup) if warmup in self.step_end and last > warmup else None
        touched = set(self.checkpoint_steps) | {s + 1 for s in self.checkpoint_steps}
        quiet = [self.hook_s.get(s, 0.0) for s in steps if s not in touched]
        base = statistics.median(quiet) if quiet else 0.0
        blocked = []
        for s in self.checkpoint_steps:
            parts = [s] + ([s + 1] if s + 1 not in self.checkpoint_steps else [])
            blocked.append(sum(max(0.0, self.hook_s.get(p, 0.0) - base) for p in parts))
        return {
            "step_s": step_s,
            "step_s_median": statistics.median(durations) if durations else None,
            "checkpoint_steps": list(self.checkpoint_steps),
            "blocked_s": blocked,
            "save_s": [self.save_s.get(s) for s in self.checkpoint_steps],
            "hook_s_median": base if self.hook_s else None,
        }


def time_hooks(obj: Any, names: Sequence[str], timeline: Timeline, current_step: Callable[[], int]) -> None:
    """Wrap ``obj``'s methods ``names`` so their time is added to ``current_step()``'s hook time.

    ``current_step()`` is read after the call returns: the global step the hook ran in or after.
    """
    for name in names:
        wrap_call(obj, name, after=lambda seconds, args, out: timeline.add_hook_time(current_step(), seconds))


def path_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes on disk of a file, or of every file under a directory."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def save_reference(arrays: Sequence[np.ndarray], path: str | os.PathLike[str]) -> None:
    """Final trainable weights, in the worker's stable order, as ``w0000``, ``w0001``, ... ."""
    np.savez(path, **{f"w{i:04d}": np.asarray(a) for i, a in enumerate(arrays)})


def max_abs_diff(arrays: Sequence[np.ndarray], path: str | os.PathLike[str]) -> float:
    """Largest |w - reference| over all weights (``inf`` if the shapes or counts differ)."""
    with np.load(path) as ref:
        names = sorted(ref.files)
        if len(names) != len(arrays):
            return float("inf")
        worst = 0.0
        for name, a in zip(names, arrays):
            r = ref[name]
            a = np.asarray(a)
            if r.shape != a.shape:
                return float("inf")
            if r.size:
                worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - r.astype(np.float64)))))
        return worst


def reported_overhead(session: Any) -> dict[str, Any]:
    """What autockpt reports as its overhead so far (``reported_overhead`` and its ~95%
    ``reported_band``, fractions), to set beside the slowdown measured against a baseline, and
    the interval in force at the end (``final_interval_steps``; None before any was chosen)."""
    reading = session.measured_overhead()
    decision = session.last_decision
    interval = decision.interval if decision is not None else None
    return {"reported_overhead": reading.value, "reported_band": reading.band,
            "final_interval_steps": interval.steps if interval is not None else None}


def ab_result(timeline: Timeline, alternation: Alternation) -> dict[str, Any]:
    """The in-process A/B's figures (:meth:`~autockpt_bench.study.in_process_ab.Alternation.figures`)
    of a run whose steps ``timeline`` recorded."""
    ends = timeline.step_end
    durations = {s: ends[s] - ends[s - 1] for s in ends if s - 1 in ends}
    return {"ab_block": alternation.block, **alternation.figures(durations)}


def finish_train(spec: dict[str, Any], result: dict[str, Any], weights: Sequence[np.ndarray]) -> None:
    """Write the reference weights and the result, then end the process without cleanup.

    ``os._exit`` skips every end-of-training save and atexit handler: the checkpoint directory
    is left as a crash right after the last completed write would leave it.
    """
    save_reference(weights, spec["reference"])
    result.setdefault("peak_rss_bytes", peak_rss_bytes())
    write_json(spec["out"], result)
    os._exit(0)


def finish_restore(spec: dict[str, Any], result: dict[str, Any], weights: Sequence[np.ndarray]) -> None:
    """Compare with the reference and write the restore result."""
    diff = max_abs_diff(weights, spec["reference"])
    result.update(max_abs_diff=diff, exact=diff == 0.0)
    write_json(spec["out"], result)
