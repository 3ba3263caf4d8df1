"""What autockpt's hooks cost per training step, and why a microsecond of Python costs ten there.

Two measurements, printed as tables and written to ``--json``:

1. ``fit``: the study's small workload (MLP 256→896×2→10, batch 64, one thread) trained for
   ``--steps`` steps with ``AutoCheckpoint(overhead_budget=0.02)`` in Lightning and in Keras
   (TensorFlow backend), every hook of the callback timed (each wrapper adds about a
   microsecond and a half: the no-op ``on_train_batch_start``/``_begin`` shows it): the median
   and the mean per step. Lightning's own dispatch of ``on_train_batch_end`` (every callback's,
   its profiler context) is timed apart. With ``--parts`` also the engine's parts (the driver's
   hot path, its decisions, the session's recording and decision, the policy), which the
   wrappers then make slower.
2. ``core``: the engine's per-step calls (``Profiler.record_iteration``, ``estimates``) in a
   plain loop, once back to back and once each after a 1024×1024 float32 matrix product, which
   evicts the CPU caches as a training step does. The second is what the hooks really cost.

    python examples/hook_cost.py --steps 3000 --json docs/benchmarks/hook-cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000, help="training steps per framework (default 3000)")
    parser.add_argument("--frameworks", default="lightning,keras", help="comma-separated (default both)")
    parser.add_argument("--core-steps", type=int, default=2000, help="iterations of each core loop (default 2000)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--parts", action="store_true",
                        help="also time the engine's parts inside the hook (each wrapper adds to it)")
    return parser.parse_args(argv)


class Timings:
    """Durations per label, from wrappers placed around methods."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds.setdefault(label, []).append(time.perf_counter() - start)

        setattr(owner, name, timed)

    def table(self, steps: int) -> dict[str, dict[str, float]]:
        return {
            label: {"calls": len(v), "median_us": 1e6 * statistics.median(v), "per_step_us": 1e6 * sum(v) / steps}
            for label, v in self.seconds.items()
        }


def _engine_parts(timings: Timings) -> None:
    """Time the engine's parts too (``--parts``): each wrapper adds its own cost to the hook
    around it, so the whole hook is measured without them by default."""
    from autockpt_core.fit_driver import FitDriver
    from autockpt_core.policy.decision import CheckpointPolicy
    from autockpt_core.policy.profiler import Profiler
    from autockpt_core.session import CheckpointSession

    timings.wrap(FitDriver, "step_end", "  driver.step_end")
    timings.wrap(FitDriver, "_decide", "    driver._decide (a decision)")
    timings.wrap(CheckpointSession, "record_steps", "      session.record_steps")
    timings.wrap(CheckpointSession, "decide", "      session.decide")
    timings.wrap(Profiler, "record_iteration", "        profiler.record_iteration")
    timings.wrap(Profiler, "step_reading", "        profiler.step_reading")
    timings.wrap(CheckpointPolicy, "decide", "        policy.decide")


def _lightning_dispatch(timings: Timings) -> None:
    """Lightning's own dispatch of ``on_train_batch_end`` (every callback, its profiler context):
    the whole ``_call_callback_hooks`` call for that hook, autockpt's hook inside it."""
    from lightning.pytorch.trainer import call

    original = call._call_callback_hooks

    def timed(trainer: Any, hook_name: str, *args: Any, **kwargs: Any) -> Any:
        if hook_name != "on_train_batch_end":
            return original(trainer, hook_name, *args, **kwargs)
        start = time.perf_counter()
        try:
            return original(trainer, hook_name, *args, **kwargs)
        finally:
            timings.seconds.setdefault("Lightning's dispatch of on_train_batch_end", []).append(
                time.perf_counter() - start)

    call._call_callback_hooks = timed


def fit_lightning(steps: int, directory: str, parts: bool) -> tuple[Timings, float]:
    import lightning.pytorch as pl
    import torch

    from autockpt_bench.study.workloads import FULL
    from autockpt_bench.workers.lightning_models import StudyModule, loader
    from autockpt_lightning import AutoCheckpoint

    torch.set_num_threads(1)
    timings = Timings()
    callback = AutoCheckpoint(directory, overhead_budget=0.02, keep_last=2, verbose=False)
    for hook in ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end"):
        timings.wrap(callback, hook, hook)
    _lightning_dispatch(timings)
    if parts:
        _engine_parts(timings)
    trainer = pl.Trainer(
        max_steps=steps, callbacks=[callback], logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, accelerator="cpu", devices=1,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(StudyModule(FULL["small"]), loader(FULL["small"]))
    return timings, time.perf_counter() - start


def fit_keras(steps: int, directory: str, parts: bool) -> tuple[Timings, float]:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from autockpt_bench.study.workloads import FULL, make_data
    from autockpt_bench.workers.keras_models import build_model
    from autockpt_keras import AutoCheckpoint

    workload = FULL["small"]
    model = build_model(workload)
    x, y = make_data(workload, workload.steps_per_epoch)
    timings = Timings()
    callback = AutoCheckpoint(directory, overhead_budget=0.02, keep_last=2, verbose=False, signals=())
    for hook in ("on_train_batch_begin", "on_train_batch_end"):
        timings.wrap(callback, hook, hook)
    if parts:
        _engine_parts(timings)
    start = time.perf_counter()
    epochs = max(1, steps // workload.steps_per_epoch)
    model.fit(x, y, batch_size=workload.batch, epochs=epochs, shuffle=False, verbose=0, callbacks=[callback])
    return timings, time.perf_counter() - start


def core_loop(steps: int, evict: bool) -> dict[str, float]:
    """Median µs of the profiler's two per-step calls, with or without a cache-evicting product."""
    import numpy as np

    from autockpt_core.policy.profiler import Profiler

    rng = random.Random(0)
    a = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)
    profiler = Profiler(warmup_steps=5, window=50)
    record, read = [], []
    for i in range(steps):
        if evict:
            a @ a
        start = time.perf_counter()
        profiler.record_iteration(0.01 + rng.random() * 1e-3, loaded=i % 10 < 3)
        record.append(time.perf_counter() - start)
        if i % 50 == 0:
            profiler.record_stall(0.001, 1000)
            profiler.record_persist(0.05)
        start = time.perf_counter()
        profiler.estimates()
        read.append(time.perf_counter() - start)
    return {"record_iteration_us": 1e6 * statistics.median(record), "estimates_us": 1e6 * statistics.median(read)}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}",
        "python": sys.version.split()[0],
        "steps": args.steps,
        "parts": args.parts,
        "fit": {},
    }
    from rich.console import Console
    from rich.table import Table

    console = Console(width=100)
    runners = {"lightning": fit_lightning, "keras": fit_keras}
    for framework in [f for f in args.frameworks.split(",") if f]:
        directory = tempfile.mkdtemp(prefix=f"autockpt-hooks-{framework}-")
        try:
            timings, wall = runners[framework](args.steps, directory, args.parts)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        table = timings.table(args.steps)
        results["fit"][framework] = {"wall_s": wall, "hooks": table}
        shown = Table(title=f"{framework}: {args.steps} steps in {wall:.1f} s")
        for column in ("hook / part", "calls", "median µs", "µs per step"):
            shown.add_column(column, justify="left" if column == "hook / part" else "right")
        for label, row in table.items():
            shown.add_row(label, str(row["calls"]), f"{row['median_us']:.1f}", f"{row['per_step_us']:.1f}")
        console.print(shown)
    results["core"] = {
        "warm": core_loop(args.core_steps, evict=False),
        "after_a_matmul": core_loop(args.core_steps, evict=True),
    }
    core = Table(title="the profiler's per-step calls, median µs")
    for column in ("", "record_iteration", "estimates"):
        core.add_column(column, justify="left" if not column else "right")
    for name, row in results["core"].items():
        core.add_row(name, f"{row['record_iteration_us']:.1f}", f"{row['estimates_us']:.1f}")
    console.print(core)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
