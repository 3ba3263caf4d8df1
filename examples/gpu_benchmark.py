"""GPU benchmark of autockpt's snapshot copy modes and of a default-settings Lightning fit.

``autockpt bench`` and ``autockpt compare`` train on the CPU only (their workers hard-code
``accelerator="cpu"``); this script measures the CUDA paths, in one process (one CUDA
context; each section cleans up after itself):

1. floors: device-to-host copy bandwidth (pinned and pageable), device-to-device, and a raw
   write + fsync to the checkpoint directory's disk;
2. per state size (``--sizes``; a stack of 4 square Linear layers trained with Adam, so
   parameters + both moments are the nominal size) a Lightning fit without checkpointing,
   then one per ``--modes`` (AutoCheckpoint with ``every_n_steps=K``, ``snapshot_mode`` =
   sync / overlap / device). K is chosen so that a persist (estimated from the disk floor)
   ends before the next checkpoint. Per mode: the training thread's blocked time per
   checkpoint (AutoCheckpoint's hooks: ``on_train_batch_end`` + ``on_before_optimizer_step``),
   the excess time of the steps around each checkpoint over the clean median, the median and
   mean step time with checkpointing vs without, the cost per checkpoint ((mean step with -
   mean step without) x K), persist time and bytes, extra GPU memory, the copy mode used.
   Every step ends with a wait for the *current* CUDA stream (not the whole device, so the
   copy stream keeps running) before its time mark, in every run alike.
3. budget rows: ``--default-fit-rounds`` rounds of a Lightning fit of ``--default-fit-seconds``
   without checkpointing and with ``AutoCheckpoint(dirpath, overhead_budget=b)`` for each of
   ``--default-fit-budgets`` (everything else default: snapshot_mode and persist_mode "auto"),
   in a rotated order per round: median step time and fit wall against the runs without
   checkpointing, the baseline's spread, the overhead autockpt reported, and per budget
   "met", "missed" or "below noise" (spread >= budget). No extra syncs in this section.

Prints a table (rich if installed) and writes JSON (``--json``) after every section, so a
run cut short keeps what it measured. Each section's error is recorded in the JSON
(``errors``) and the next section runs. ``--budget-s`` is a soft deadline: a section or run
that would not fit is skipped and said so.

    python examples/gpu_benchmark.py --json gpu_benchmark.json                  # H100/H200: ~3 min (--budget-s)
    python examples/gpu_benchmark.py --device cpu --sizes 4MB,16MB --default-fit-seconds 3 \\
        --clean-steps 40 --json /tmp/gpu_benchmark_cpu.json                     # plumbing check on a CPU
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from autockpt_bench.study.in_process_ab import Alternation, ab_block  # noqa: E402
from autockpt_bench.study.report import ab_band, ab_verdict  # noqa: E402
from autockpt_bench.workers.hooks import log_calls  # noqa: E402
from autockpt_bench.workers.stacked_linear import StackedLinear  # noqa: E402
from autockpt_core.units import parse_size  # noqa: E402

LAYERS = 4
STATE_COPIES = 3  # parameters, Adam's two moments
BATCH = 16
POOL = 8  # distinct batches, cycled
AROUND = 3  # steps after a checkpoint counted as "around" it (the overlapped copy runs in the next one)


def now() -> float:
    return time.perf_counter()


def mlp_width(state_bytes: int) -> int:
    params = max(1, state_bytes // (STATE_COPIES * 4))
    return max(8, int(math.sqrt(params / LAYERS)))


def fmt_size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}B"


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


class Results:
    """The JSON document, rewritten (atomically) after every section."""

    def __init__(self, path: str | None, meta: dict[str, Any]) -> None:
        self.path = path
        self.doc: dict[str, Any] = {"meta": meta, "floors": {}, "modes": {}, "default_fit": {}, "errors": [],
                                    "skipped": []}

    def error(self, section: str, exc: BaseException) -> None:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.doc["errors"].append({"section": section, "error": f"{type(exc).__name__}: {exc}", "traceback": text})
        print(f"!! {section}: {type(exc).__name__}: {exc}", flush=True)

    def skip(self, section: str, why: str) -> None:
        self.doc["skipped"].append({"section": section, "why": why})
        print(f"-- skipped {section}: {why}", flush=True)

    def write(self) -> None:
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1, default=str)
        os.replace(tmp, self.path)


# -- floors ------------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def floors(device: torch.device, nbytes: int, directory: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"bytes": nbytes}
    if device.type == "cuda":
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        src.fill_(1)
        pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        pageable = torch.empty(nbytes, dtype=torch.uint8)
        other = torch.empty_like(src)

        def rate(fn: Callable[[], Any]) -> float:
            fn()
            sync(device)
            times = []
            for _ in range(3):
                start = now()
                fn()
                sync(device)
                times.append(now() - start)
            return nbytes / min(times) / 1e9

        out["d2h_pinned_GBps"] = rate(lambda: pinned.copy_(src, non_blocking=True))
        out["d2h_pageable_GBps"] = rate(lambda: pageable.copy_(src))
        out["d2d_GBps"] = rate(lambda: other.copy_(src))
        out["h2d_pinned_GBps"] = rate(lambda: src.copy_(pinned, non_blocking=True))
        del src, pinned, pageable, other
        torch.cuda.empty_cache()
    data = os.urandom(64 * 2**20)
    path = directory / "raw-write-floor.bin"
    start = now()
    with open(path, "wb", buffering=0) as f:
        written = 0
        while written < nbytes:
            written += f.write(data[: min(len(data), nbytes - written)])
        os.fsync(f.fileno())
    out["disk_write_fsync_GBps"] = nbytes / (now() - start) / 1e9
    path.unlink()
    usage = shutil.disk_usage(directory)
    out["disk_free_GB"] = usage.free / 1e9
    return out


# -- Lightning runs ----------------------------------------------------------------------------------


@dataclasses.dataclass
class RunRecord:
    marks: dict[int, float]
    hooks: list[tuple[float, float]]
    windows: list[tuple[float, float]]
    wall_s: float
    extra: dict[str, Any]


_PERSIST_WINDOWS: list[tuple[float, float]] = []


def track_persists() -> bool:
    """Record (start, end) of every background persist (wraps CheckpointWriter._run once)."""
    try:
        from autockpt_core.persist.writer import CheckpointWriter
    except Exception:
        return False
    original = CheckpointWriter._run
    if getattr(original, "_gpu_bench", False):
        return True

    def timed_run(self: Any, job: Any) -> None:
        start = now()
        try:
            original(self, job)
        finally:
            _PERSIST_WINDOWS.append((start, now()))

    timed_run._gpu_bench = True  # type: ignore[attr-defined]
    CheckpointWriter._run = timed_run  # type: ignore[method-assign]
    return True


class Batches(torch.utils.data.Dataset):
    """``steps`` batches cycling through a small pool that already lives on the device."""

    def __init__(self, pool: list[tuple[torch.Tensor, torch.Tensor]], steps: int) -> None:
        self.pool, self.steps = pool, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool[i % len(self.pool)]


def fit(
    device: torch.device,
    width: int,
    steps: int,
    directory: Path | None,
    auto_kwargs: dict[str, Any] | None,
    *,
    timed_steps: bool = True,
    span_from: int | None = None,
    max_seconds: float | None = None,
    alternation: Alternation | None = None,
) -> RunRecord:
    """One Lightning fit of ``steps`` optimizer steps; AutoCheckpoint when ``auto_kwargs`` is
    not None. ``timed_steps``: wait for the current stream at each step's end and mark it;
    else, with ``span_from``, mark (after such a wait) only steps ``span_from`` and ``steps``,
    and keep the time of the latest step under key -1 (no wait). ``max_seconds``: Lightning's
    ``max_time``, a guard against a step-time estimate far off (``extra["steps_done"]``).
    ``alternation`` (with ``timed_steps=False`` and no ``span_from``): the in-process A/B's
    blocks are applied to AutoCheckpoint's session, and every step's end is marked on the
    device's timeline: a CUDA event recorded on the current stream (no wait), so a step's
    duration is the device's, idle gaps while it waited for the host included, not the host's
    view of a queue (``extra["step_s"]``; host time on the CPU)."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback

    from autockpt_lightning import AutoCheckpoint

    marks: dict[int, float] = {}
    hooks: list[tuple[float, float]] = []
    cuda = device.type == "cuda"

    class SpanStart(Callback):  # before AutoCheckpoint: a checkpoint at span_from is inside the span
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if not timed_steps and trainer.global_step == span_from:
                if cuda:
                    torch.cuda.current_stream(device).synchronize()
                marks[trainer.global_step] = now()

    class StepTimer(Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, *args: Any) -> None:
            if not timed_steps and trainer.global_step == span_from:
                return  # marked by SpanStart
            if timed_steps or trainer.global_step in (span_from, steps):
                if cuda:
                    torch.cuda.current_stream(device).synchronize()  # not the copy stream
                marks[trainer.global_step] = now()
            elif span_from is not None:
                marks[-1] = now()
                marks[-2] = trainer.global_step

    step_events: dict[int, Any] = {}
    modes: dict[int, str | None] = {}
    pinned: list[tuple[int, int]] = []
    device_bytes: list[int] = []

    class ModeLog(Callback):  # after AutoCheckpoint
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if tracked.events and tracked.events[-1].step == trainer.global_step and trainer.global_step not in modes:
                modes[trainer.global_step] = tracked._snapshotter.mode
                device_bytes.append(tracked._snapshotter.device_buffer_bytes)
                buffers = [e[2] for e in tracked.session.buffers._buffers.values() if e[2].numel()]
                pinned.append((sum(bool(b.is_pinned()) for b in buffers) if cuda else 0, len(buffers)))

    class BlockTimer(Callback):  # after AutoCheckpoint and ModeLog: the A/B's step marks
        def on_train_start(self, *args: Any) -> None:
            assert alternation is not None
            alternation.attach(tracked.session)

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            assert alternation is not None
            step = trainer.global_step
            if cuda:
                event = torch.cuda.Event(enable_timing=True)
                event.record(torch.cuda.current_stream(device))
                step_events[step] = event
            else:
                marks[step] = now()
            alternation.step_done(step)

    callbacks: list[Any] = [SpanStart()]
    tracked: Any = None
    if auto_kwargs is not None:
        assert directory is not None
        tracked = AutoCheckpoint(str(directory), **auto_kwargs)
        log_calls(tracked, ("on_train_batch_end", "on_before_optimizer_step"), hooks)
        callbacks += [tracked, ModeLog()]
        if alternation is not None:
            callbacks.append(BlockTimer())
    callbacks.append(StepTimer())

    torch.manual_seed(0)
    pool = [(torch.randn(BATCH, width, device=device),) * 2 for _ in range(POOL)]
    loader = torch.utils.data.DataLoader(Batches(pool, steps + 1), batch_size=None, shuffle=False)
    with torch.device(device):  # parameters made on the device directly (fast at 4 GB)
        model = StackedLinear(width, LAYERS, lr=1e-5)
    trainer = pl.Trainer(
        max_steps=steps, max_epochs=1, accelerator="gpu" if cuda else "cpu", devices=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        callbacks=callbacks, num_sanity_val_steps=0, default_root_dir=str(directory or tempfile.gettempdir()),
        max_time=None if max_seconds is None else {"seconds": max(1, int(max_seconds))},
    )
    _PERSIST_WINDOWS.clear()
    if cuda:
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base_mem = torch.cuda.memory_allocated(device)
    start = now()
    trainer.fit(model, loader)
    if cuda:
        sync(device)
    wall = now() - start
    extra: dict[str, Any] = {"steps_done": trainer.global_step}
    if cuda:
        extra["gpu_peak_bytes"] = torch.cuda.max_memory_allocated(device) - base_mem
    if alternation is not None:
        extra["step_s"] = ({s: step_events[s - 1].elapsed_time(step_events[s]) / 1e3 for s in step_events
                            if s - 1 in step_events} if cuda else step_durations(marks))
    if tracked is not None:
        session = tracked.session
        est = session.estimates()
        records = session.records()
        summary = session.summary()
        trial = tracked._snapshotter.trial
        choice = tracked._snapshotter.choice
        extra.update(
            events=[{"step": e.step, "stall_ms": e.stall_s * 1e3, "reason": e.reason, "nbytes": e.nbytes}
                    for e in tracked.events],
            modes_used=[modes[s] for s in sorted(modes)],
            pinned=pinned,
            device_buffer_bytes=max(device_bytes, default=0),
            persist_s=est.persist_s,
            policy_stall_ms=None if est.stall_s is None else est.stall_s * 1e3,  # the device's clock on CUDA
            file_bytes=records[-1].size if records else None,
            persist_mode=session.persist_mode.mode,
            persist_mode_reason=session.persist_mode.reason,
            buffer_peak_bytes=session.buffers.peak_bytes,
            summary=summary.as_dict(),
            summary_line=summary.line(),
            meter=meter_state(session),
            copy_choice=choice.reason if choice is not None else None,
            trial=None if trial is None else {
                "candidates": list(trial.candidates), "chosen": trial.chosen,
                "measured": [dataclasses.asdict(c) for c in trial.measured],
            },
        )
    windows = list(_PERSIST_WINDOWS)
    del trainer, model, pool, loader
    tracked = None  # drop the callback, its session and buffers before the next run
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return RunRecord(marks, hooks, windows, wall, extra)


def meter_state(session: Any) -> dict[str, Any] | None:
    """The overhead meter's sums (autockpt_core/policy/overhead_meter.py), to see what its
    reported overhead is made of: clean and loaded steps, blocked time."""
    meter = getattr(getattr(session, "ledger", None), "meter", None)
    if meter is None:
        return None
    return {"clean_n": meter._clean_n, "clean_mean_ms": meter._clean_mean * 1e3, "loaded_n": meter._loaded_n,
            "loaded_mean_ms": meter._loaded_sum / meter._loaded_n * 1e3 if meter._loaded_n else None,
            "blocked_s": meter._blocked}


def keras_fit(
    device: torch.device,
    width: int,
    steps: int,
    directory: Path | None,
    auto_kwargs: dict[str, Any] | None,
    *,
    timed_steps: bool = True,
    span_from: int | None = None,
    max_seconds: float | None = None,
) -> RunRecord:
    """The same model and data as :func:`fit` in Keras 3 on its torch backend (the model on
    ``device``): ``layers`` Dense(width) with ReLU between, Adam, MSE, batches of ``BATCH``
    cycling through ``POOL`` distinct ones (one epoch each cycle). Marks as :func:`fit`;
    ``max_seconds`` stops the fit after that long (``extra["steps_done"]``)."""
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import numpy as np

    from autockpt_keras import AutoCheckpoint

    if keras.backend.backend() != "torch":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()!r}, not torch: set KERAS_BACKEND=torch first")
    marks: dict[int, float] = {}
    cuda = device.type == "cuda"
    state = {"step": 0, "start": 0.0}

    class SpanStart(keras.callbacks.Callback):  # before AutoCheckpoint, as in fit()
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if not timed_steps and state["step"] + 1 == span_from:
                if cuda:
                    torch.cuda.current_stream(device).synchronize()
                marks[span_from] = now()

    class StepTimer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            state["step"] += 1
            step = state["step"]
            if not timed_steps and step == span_from:
                pass  # marked by SpanStart
            elif timed_steps or step in (span_from, steps):
                if cuda:
                    torch.cuda.current_stream(device).synchronize()
                marks[step] = now()
            elif span_from is not None:
                marks[-1], marks[-2] = now(), step
            if step >= steps or max_seconds is not None and now() - state["start"] > max_seconds:
                self.model.stop_training = True

    callbacks: list[Any] = [SpanStart()]
    tracked: Any = None
    if auto_kwargs is not None:
        assert directory is not None
        tracked = AutoCheckpoint(str(directory), **auto_kwargs)
        callbacks.append(tracked)
    callbacks.append(StepTimer())
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(POOL * BATCH, width)).astype("float32")
    layers = [keras.Input((width,))]
    for i in range(LAYERS):
        layers.append(keras.layers.Dense(width, activation="relu" if i < LAYERS - 1 else None))
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.Adam(1e-5), loss="mse")
    epochs = -(-(steps + 1) // POOL)
    if cuda:
        sync(device)
    start = state["start"] = now()
    model.fit(x, x, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    if cuda:
        sync(device)
    wall = now() - start
    extra: dict[str, Any] = {"steps_done": state["step"]}
    if tracked is not None:
        summary = tracked.summary
        extra.update(
            events=[{"step": e.step, "stall_ms": e.stall_s * 1e3, "reason": e.reason, "nbytes": e.nbytes}
                    for e in tracked.events],
            summary=summary.as_dict() if summary is not None else None,
            summary_line=summary.line() if summary is not None else None,
            meter=meter_state(tracked.session),
        )
    del model, x, tracked
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return RunRecord(marks, [], [], wall, extra)


def step_durations(marks: dict[int, float]) -> dict[int, float]:
    return {s: marks[s] - marks[s - 1] for s in sorted(marks) if s - 1 in marks}


def clean_stats(run: RunRecord, warm: int) -> dict[str, Any]:
    d = [v for s, v in step_durations(run.marks).items() if s > warm]
    steps = sorted(s for s in run.marks if s >= warm)
    mean = (run.marks[steps[-1]] - run.marks[steps[0]]) / (steps[-1] - steps[0]) if len(steps) > 1 else None
    return {"median_step_ms": (median(d) or 0) * 1e3, "mean_step_ms": mean * 1e3 if mean else None,
            "p90_step_ms": sorted(d)[int(0.9 * (len(d) - 1))] * 1e3 if d else None, "steps": len(d),
            "wall_s": run.wall_s, "first_steps_max_ms": max(step_durations(run.marks).get(s, 0) for s in range(1, warm + 1)) * 1e3
            if warm else None}


def mode_stats(run: RunRecord, warm: int, every: int, clean_ms: float | None, clean_mean_ms: float | None) -> dict[str, Any]:
    durations = step_durations(run.marks)
    ckpts = [e["step"] for e in run.extra.get("events", []) if e["step"] in run.marks]
    per_ckpt_blocked = []
    for c in ckpts:  # the hook of step c and the pre-update wait of step c + 1
        lo, hi = run.marks.get(c - 1, 0.0), run.marks.get(c + 1, float("inf"))
        per_ckpt_blocked.append(sum(sec for start, sec in run.hooks if lo < start <= hi))
    near = {s for c in ckpts for s in range(c, c + AROUND + 1)}
    in_persist = {
        s for s in durations
        if any(start < run.marks[s] and end > run.marks[s] - durations[s] for start, end in run.windows)
    }
    clean_here = [v for s, v in durations.items() if s > warm and s not in near and s not in in_persist]
    ref = median(clean_here) if clean_here else (clean_ms / 1e3 if clean_ms else None)
    excess = []
    if ref is not None:
        for c in ckpts:
            excess.append(sum(durations[s] - ref for s in range(c, c + AROUND + 1) if s in durations))
    overlapped = [v for s, v in durations.items() if s > warm and s in in_persist and s not in near]
    after_warm = [v for s, v in durations.items() if s > warm]
    steps = sorted(s for s in run.marks if s >= warm)
    mean = (run.marks[steps[-1]] - run.marks[steps[0]]) / (steps[-1] - steps[0]) if len(steps) > 1 else None
    out: dict[str, Any] = {
        "every": every,
        "checkpoints": len(ckpts),
        "blocked_ms": [b * 1e3 for b in per_ckpt_blocked],
        "blocked_median_ms": (median(per_ckpt_blocked) or 0) * 1e3 if per_ckpt_blocked else None,
        "blocked_first_ms": per_ckpt_blocked[0] * 1e3 if per_ckpt_blocked else None,
        "excess_around_ckpt_ms": [e * 1e3 for e in excess],
        "excess_around_ckpt_median_ms": median(excess) * 1e3 if excess else None,
        "clean_step_here_ms": ref * 1e3 if ref else None,
        "step_overlapping_persist_ms": median(overlapped) * 1e3 if overlapped else None,
        "steps_overlapping_persist": len(overlapped),
        "median_step_ms": median(after_warm) * 1e3 if after_warm else None,
        "mean_step_ms": mean * 1e3 if mean else None,
        "wall_s": run.wall_s,
    }
    if clean_mean_ms and mean:
        out["amortized_slowdown"] = mean * 1e3 / clean_mean_ms - 1
        out["cost_per_ckpt_ms"] = (mean * 1e3 - clean_mean_ms) * every
    persist = run.extra.get("persist_s")
    nbytes = run.extra.get("file_bytes")
    if persist and nbytes:
        out["persist_GBps"] = nbytes / persist / 1e9
    out["persist_windows_s"] = [end - start for start, end in run.windows]
    out.update({k: v for k, v in run.extra.items() if k not in ("summary",)})
    return out


# -- sections ----------------------------------------------------------------------------------------


class Deadline:
    def __init__(self, budget_s: float) -> None:
        self.start = now()
        self.budget_s = budget_s

    def left(self) -> float:
        return self.budget_s - (now() - self.start)


def modes_section(
    args: argparse.Namespace, device: torch.device, size: int, root: Path, res: Results, deadline: Deadline,
    disk_bps: float,
) -> None:
    key = fmt_size(size)
    width = mlp_width(size)
    section: dict[str, Any] = {"nominal_bytes": size, "width": width, "layers": LAYERS, "batch": BATCH, "runs": {}}
    res.doc["modes"][key] = section
    warm = args.warmup_steps
    clean_steps = warm + args.clean_steps
    t0 = now()
    base = fit(device, width, clean_steps, None, None)
    clean = clean_stats(base, warm)
    section["runs"]["none"] = clean
    state_bytes = STATE_COPIES * 4 * LAYERS * (width * width + width)
    section["state_bytes"] = state_bytes
    step_s = (clean["median_step_ms"] or 1.0) / 1e3
    persist_est = state_bytes / max(disk_bps * args.persist_vs_raw, 1e6) + 0.05
    every = int(min(args.max_every, max(args.min_every, math.ceil(args.persist_margin * persist_est / step_s))))
    section.update(step_s=step_s, persist_estimate_s=persist_est, every=every, baseline_setup_s=now() - t0 - base.wall_s)
    print(f"[{key}] width {width}, state {fmt_size(state_bytes)}, clean step {step_s * 1e3:.2f} ms, "
          f"persist est. {persist_est:.2f}s -> every {every} steps", flush=True)
    res.write()
    setup = max(2.0, section["baseline_setup_s"])  # a fit's time outside its steps

    def estimate_s(n: int) -> float:  # training, or back-to-back persists when they take longer
        return max((warm + n * every) * step_s * 1.3, n * persist_est) + n * 0.2 + setup + persist_est

    for mode in args.modes:
        checkpoints = args.checkpoints
        steps = warm + checkpoints * every + AROUND + 1
        estimate = estimate_s(checkpoints)
        if estimate > deadline.left():
            checkpoints = 2
            steps = warm + checkpoints * every + AROUND + 1
            estimate = estimate_s(checkpoints)
            if estimate > deadline.left():
                res.skip(f"modes/{key}/{mode}", f"estimated {estimate:.0f}s > {deadline.left():.0f}s left")
                continue
        directory = root / f"{key}-{mode}"
        try:
            run = fit(device, width, steps, directory, dict(
                every_n_steps=every, keep_last=2, resume=False, verbose=False, snapshot_mode=mode, signals=(),
                save_on_train_end=False,
            ), max_seconds=3 * estimate + 10)
            section["runs"][mode] = mode_stats(run, warm, every, clean["median_step_ms"], clean["mean_step_ms"])
            s = section["runs"][mode]
            print(f"[{key}] {mode}: used {sorted(set(s.get('modes_used') or []))}, blocked "
                  f"{s['blocked_median_ms'] or 0:.1f} ms (first {s['blocked_first_ms'] or 0:.1f}), excess around "
                  f"{s['excess_around_ckpt_median_ms'] or 0:.1f} ms, persist {s.get('persist_s') or 0:.2f}s", flush=True)
        except Exception as exc:
            res.error(f"modes/{key}/{mode}", exc)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            res.write()


def default_fit_section(
    args: argparse.Namespace, device: torch.device, size: int, root: Path, res: Results, deadline: Deadline,
    framework: str = "lightning",
) -> None:
    """Budget rows: ``--default-fit-rounds`` rounds of a fit without checkpointing and one
    ``AutoCheckpoint(dirpath, overhead_budget=b)`` fit per ``--default-fit-budgets`` (nothing
    else set), each round in a rotated order so that no configuration always runs first."""
    key = f"{framework} {fmt_size(size)}"
    width = mlp_width(size)
    run_fit = keras_fit if framework == "keras" else fit
    section: dict[str, Any] = {"nominal_bytes": size, "width": width, "framework": framework, "runs": {}, "rows": {}}
    res.doc["default_fit"][key] = section
    probe = run_fit(device, width, args.warmup_steps + 40, None, None)  # step time, setup excluded
    step_s = max(1e-5, (clean_stats(probe, args.warmup_steps)["mean_step_ms"] or 1.0) / 1e3)
    steps = max(50, int(args.default_fit_seconds / step_s))
    section.update(steps=steps, probe_step_ms=step_s * 1e3, rounds=args.default_fit_rounds)
    configs: list[tuple[str, dict[str, Any] | None, float | None]] = [("none", None, None)]
    configs += [(f"autockpt, budget {b:.0%}", dict(resume=False, overhead_budget=b), b) for b in args.default_fit_budgets]
    configs += [(f"every {k} steps", dict(resume=False, every_n_steps=k), None) for k in args.default_fit_every]
    for rnd in range(args.default_fit_rounds):
        shift = rnd % len(configs)
        for name, auto_kwargs, _ in configs[shift:] + configs[:shift]:
            need = args.default_fit_seconds * 1.5 + 5
            if need > deadline.left():
                res.skip(f"default_fit/{key}/{name}/round {rnd + 1}", f"needs ~{need:.0f}s, {deadline.left():.0f}s left")
                continue
            directory = root / f"default-{key}-{rnd}-{len(section['runs'].get(name, []))}-{auto_kwargs is None}"
            try:
                warm = args.warmup_steps
                run = run_fit(device, width, steps, directory if auto_kwargs is not None else None, auto_kwargs,
                                  timed_steps=False, span_from=warm, max_seconds=3 * args.default_fit_seconds + 10)
                end, last = ((steps, run.marks.get(steps)) if steps in run.marks
                             else (run.marks.get(-2), run.marks.get(-1)))
                train_s = last - run.marks[warm] if warm in run.marks and last is not None and end else None
                n = (end or 0) - warm
                entry = {"round": rnd + 1, "wall_s": run.wall_s if end == steps else None, "train_s": train_s,
                         "train_steps": n, "step_ms": train_s / n * 1e3 if train_s and n > 0 else None,
                         "truncated": end != steps, **run.extra}
                section["runs"].setdefault(name, []).append(entry)
                summ = entry.get("summary") or {}
                print(f"[default {key}] round {rnd + 1} {name}: fit {run.wall_s:.2f}s, {entry['step_ms'] or 0:.3f} "
                      f"ms/step over steps {warm}-{end}{' (stopped by the time guard)' if end != steps else ''}"
                      + (f", {summ.get('checkpoints')} checkpoints, reported overhead {pct(summ.get('overhead'))}, "
                         f"interval {summ.get('interval_steps')}, policy stall {num(entry.get('policy_stall_ms'))} ms"
                         if summ else ""), flush=True)
            except Exception as exc:
                res.error(f"default_fit/{key}/{name}/round {rnd + 1}", exc)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
                res.write()
    section["rows"] = budget_rows(section["runs"], configs)
    res.write()
    if framework == "lightning" and args.ab_cycles > 0:
        ab_section(args, device, width, step_s, root, res, deadline, section)


def ab_section(
    args: argparse.Namespace, device: torch.device, width: int, step_s: float, root: Path, res: Results,
    deadline: Deadline, section: dict[str, Any],
) -> None:
    """Per budget row: the in-process A/B (:mod:`autockpt_bench.study.in_process_ab`) of the
    interval its runs ended with (their median), AutoCheckpoint with ``every_n_steps`` at that
    interval, checkpoints taken in the on blocks and held back in the off blocks; the warm-up
    holds the first checkpoint (its buffers). Up to ``--ab-cycles`` cycles, fewer where they
    would take over ``--ab-seconds``. Step times are the device's (see :func:`fit`); no step is
    left out as an outlier (a checkpoint's copy is a real gap on that timeline). The hooks run in both arms: the A/B is the checkpoints' cost.
    ``--ab-every`` gives the intervals instead (one per budget, in order), without budget runs."""
    rows = section.get("rows") or {}
    if args.ab_every:
        rows = {f"autockpt, budget {b:.0%}": {"budget": b, "interval_steps": [k]}
                for b, k in zip(args.default_fit_budgets, args.ab_every)}
    for name, row in rows.items():
        budget = row.get("budget")
        intervals = [i for i in row.get("interval_steps") or [] if i]
        if budget is None or not intervals:
            continue
        every = int(median(intervals) or 0)
        block = ab_block(every)
        warmup = every + args.warmup_steps
        cycles = max(2, min(args.ab_cycles, int(args.ab_seconds / (2 * block * step_s))))
        steps = warmup + 2 * cycles * block
        need = steps * step_s * 1.3 + 5
        label = f"{name}: A/B every {every}"
        if need > deadline.left():
            res.skip(f"ab/{label}", f"needs ~{need:.0f}s, {deadline.left():.0f}s left")
            continue
        directory = root / f"ab-{every}"
        alternation = Alternation(block, warmup)
        try:
            auto_kwargs = dict(resume=False, every_n_steps=every, save_on_train_end=False)
            run = fit(device, width, steps, directory, auto_kwargs, timed_steps=False, alternation=alternation,
                      max_seconds=3 * need + 10)
            figures = alternation.figures(run.extra.pop("step_s"), outlier_factor=None)
            n = len(figures["ab_cycles"])
            band = ab_band(figures["ab_noise"], n)
            overhead = figures["ab_overhead"]
            entry = {"budget": budget, "every": every, "block": block, "warmup": warmup, "steps": steps,
                     "wall_s": run.wall_s, "checkpoints": len(run.extra.get("events") or []), "ab_band": band,
                     "verdict": ab_verdict(overhead, band, budget) if overhead is not None else None,
                     **figures}
            section.setdefault("ab", {})[name] = entry
            print(f"[ab] {label}: {n} cycles, checkpoints {pct(overhead)}"
                  + (f" ±{band * 100:.1f}" if band is not None else "")
                  + f", meter {pct(figures['ab_meter_view'])}, {entry['verdict']}", flush=True)
        except Exception as exc:
            res.error(f"ab/{label}", exc)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            res.write()


def budget_rows(runs: dict[str, list[dict[str, Any]]], configs: list[tuple[str, Any, float | None]]) -> dict[str, Any]:
    """Per configuration: median step time and fit wall, the slowdown of those medians against
    the runs without checkpointing, the baseline's spread ((max - min) / median of its step
    times) and, per budget, a verdict: "met" / "missed" where the spread is below the budget,
    "below noise" where it is not."""
    def med(name: str, measure: str) -> float | None:
        return median([r[measure] for r in runs.get(name, []) if r.get(measure)])

    base_steps = [r["step_ms"] for r in runs.get("none", []) if r.get("step_ms")]
    base = median(base_steps)
    base_wall = med("none", "wall_s")
    spread = (max(base_steps) - min(base_steps)) / base if base and len(base_steps) > 1 else None
    rows: dict[str, Any] = {}
    for name, _, budget in configs:
        step_ms, wall_s = med(name, "step_ms"), med(name, "wall_s")
        reported = [(r.get("summary") or {}).get("overhead") for r in runs.get(name, [])]
        reported = [x for x in reported if x is not None]
        row: dict[str, Any] = {
            "runs": len(runs.get(name, [])), "step_ms": step_ms, "wall_s": wall_s,
            "step_ms_all": [r.get("step_ms") for r in runs.get(name, [])],
            "slowdown": step_ms / base - 1 if step_ms and base else None,
            "wall_slowdown": wall_s / base_wall - 1 if wall_s and base_wall else None,
            "reported_overhead": median(reported), "budget": budget, "baseline_spread": spread,
            "checkpoints": median([(r.get("summary") or {}).get("checkpoints") or 0 for r in runs.get(name, [])]),
            "interval_steps": [(r.get("summary") or {}).get("interval_steps") for r in runs.get(name, [])],
            "copy_mode": sorted({str((r.get("summary") or {}).get("copy_mode")) for r in runs.get(name, [])}),
            "blocked_ms": median([e["stall_ms"] for r in runs.get(name, []) for e in r.get("events") or []
                                  if e.get("reason") != "end of training"]),
            "policy_stall_ms": [r.get("policy_stall_ms") for r in runs.get(name, [])],
        }
        if budget is not None and row["slowdown"] is not None and spread is not None:
            row["verdict"] = ("below noise" if spread >= budget
                              else "met" if row["slowdown"] <= budget else "missed")
            if row["reported_overhead"] is not None:
                row["reported_minus_measured"] = row["reported_overhead"] - row["slowdown"]
        rows[name] = row
    return rows


# -- output ------------------------------------------------------------------------------------------


def pct(x: Any) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def num(x: Any, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def tables(doc: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    out = []
    fl = doc.get("floors") or {}
    if fl:
        cols = ["d2h pinned GB/s", "d2h pageable GB/s", "d2d GB/s", "h2d pinned GB/s", "disk write+fsync GB/s"]
        keys = ["d2h_pinned_GBps", "d2h_pageable_GBps", "d2d_GBps", "h2d_pinned_GBps", "disk_write_fsync_GBps"]
        out.append(("floors", cols, [[num(fl.get(k), 2) for k in keys]]))
    rows = []
    for key, sec in (doc.get("modes") or {}).items():
        none = sec.get("runs", {}).get("none", {})
        rows.append([key, "none", "-", "-", "-", "-", num(none.get("median_step_ms"), 2), num(none.get("mean_step_ms"), 2),
                     "-", "-", "-", "-", "-", "-"])
        for mode, r in sec.get("runs", {}).items():
            if mode == "none":
                continue
            used = ",".join(sorted(set(x for x in r.get("modes_used") or [] if x)))
            rows.append([
                key, mode + ("" if used in ("", mode) else f" (used {used})"), str(r.get("every")),
                str(r.get("checkpoints")), f"{num(r.get('blocked_median_ms'))} / {num(r.get('blocked_first_ms'))}",
                num(r.get("excess_around_ckpt_median_ms")), num(r.get("median_step_ms"), 2), num(r.get("mean_step_ms"), 2),
                num(r.get("cost_per_ckpt_ms")), pct(r.get("amortized_slowdown")), num(r.get("persist_s"), 2),
                num(r.get("persist_GBps"), 2), fmt_size(r.get("file_bytes")),
                fmt_size(r.get("device_buffer_bytes") or None),
            ])
    if rows:
        out.append(("snapshot modes (AutoCheckpoint every K steps; step ends wait for the current stream)", [
            "size", "mode", "K", "ckpts", "blocked ms (median / first)", "excess around ckpt ms", "step ms median",
            "step ms mean", "cost per ckpt ms", "amortized slowdown", "persist s", "persist GB/s", "file",
            "reserved GPU"], rows))
    rows = []
    for key, sec in (doc.get("default_fit") or {}).items():
        for name, r in (sec.get("rows") or {}).items():
            rows.append([key, name, str(r.get("runs")), num(r.get("step_ms"), 3), pct(r.get("slowdown")),
                         num(r.get("wall_s"), 2), pct(r.get("wall_slowdown")), pct(r.get("reported_overhead")),
                         pct(r.get("baseline_spread")), str(r.get("checkpoints", "-")),
                         ",".join(r.get("copy_mode") or []) or "-", str(r.get("verdict", "-"))])
    if rows:
        out.append(("AutoCheckpoint with only overhead_budget set vs none (medians over rounds; no extra syncs)", [
            "size", "run", "runs", "step ms (after warm-up)", "slowdown", "fit wall s", "wall slowdown",
            "reported overhead", "baseline spread", "ckpts", "copy mode", "budget"], rows))
    rows = []
    for key, sec in (doc.get("default_fit") or {}).items():
        for name, r in (sec.get("ab") or {}).items():
            band = r.get("ab_band")
            rows.append([key, name, str(r.get("every")), str(len(r.get("ab_cycles") or [])),
                         pct(r.get("ab_overhead")) + (f" ±{band * 100:.1f}" if band is not None else ""),
                         pct(r.get("ab_meter_view")), pct(r.get("ab_reference_spread")),
                         num(r.get("ab_spill_steps"), 0), str(r.get("verdict") or "-")])
    if rows:
        out.append(("in-process A/B of each budget's interval (checkpoints only; ±: 95% Student-t)", [
            "size", "budget run", "every", "cycles", "checkpoints' cost", "meter, same blocks",
            "reference spread", "spill steps", "checkpoints vs budget"], rows))
    return out


def print_tables(doc: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        console = Console(width=200)
        for title, cols, rows in tables(doc):
            table = Table(title=title)
            for c in cols:
                table.add_column(c)
            for r in rows:
                table.add_row(*r)
            console.print(table)
    except ImportError:
        for title, cols, rows in tables(doc):
            print(f"\n{title}\n" + " | ".join(cols))
            for r in rows:
                print(" | ".join(r))
    for err in doc.get("errors", []):
        print(f"ERROR {err['section']}: {err['error']}")
    for skip in doc.get("skipped", []):
        print(f"SKIPPED {skip['section']}: {skip['why']}")


# -- main --------------------------------------------------------------------------------------------


def meta(device: torch.device, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "argv": sys.argv, "python": platform.python_version(), "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(), "device": str(device), "cpu_count": os.cpu_count(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    with contextlib.suppress(Exception):
        import lightning

        out["lightning"] = lightning.__version__
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(gpu=props.name, gpu_total_bytes=props.total_memory, capability=f"{props.major}.{props.minor}",
                   cuda_runtime=torch.version.cuda, gpu_free_bytes=torch.cuda.mem_get_info(device)[0])
    with contextlib.suppress(Exception):
        out["host_mem_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--sizes", default="100MB,1GB,4GB", help="state sizes (parameters + Adam moments)")
    p.add_argument("--modes", default="sync,overlap,device")
    p.add_argument("--checkpoints", type=int, default=3, help="checkpoints per mode run")
    p.add_argument("--clean-steps", type=int, default=150, help="timed steps of each run without checkpointing")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--min-every", type=int, default=20)
    p.add_argument("--max-every", type=int, default=1500)
    p.add_argument("--persist-margin", type=float, default=1.5,
                   help="K x step time >= this x the estimated persist time")
    p.add_argument("--persist-vs-raw", type=float, default=0.5,
                   help="assumed persist throughput as a fraction of the raw disk floor (for choosing K)")
    p.add_argument("--default-fit-size", default="1GB", help="state size of the default-settings fit ('' skips it)")
    p.add_argument("--default-fit-seconds", type=float, default=10.0, help="length of each run of that fit")
    p.add_argument("--default-fit-rounds", type=int, default=3, help="rounds of that fit (each: none, then every budget)")
    p.add_argument("--default-fit-budgets", default="0.02,0.05", help="overhead_budget of each AutoCheckpoint run")
    p.add_argument("--default-fit-every", default="",
                   help="also fixed intervals (every_n_steps, comma-separated) in the same rounds: the cost of each")
    p.add_argument("--default-fit-frameworks", default="lightning",
                   help="lightning and/or keras (Keras 3 on its torch backend), comma-separated")
    p.add_argument("--ab-cycles", type=int, default=8,
                   help="cycles of the in-process A/B of each Lightning budget row's interval (0: none)")
    p.add_argument("--ab-seconds", type=float, default=60.0, help="fewer cycles where they would take longer")
    p.add_argument("--ab-every", default="",
                   help="A/B at these intervals (steps, one per budget) instead of the budget runs' own")
    p.add_argument("--floor-bytes", default="512MB")
    p.add_argument("--budget-s", type=float, default=170.0, help="soft deadline for the whole run (seconds)")
    p.add_argument("--dir", default=None, help="checkpoint directory (default: a temporary directory; removed)")
    p.add_argument("--json", default=None, help="write results here (after every section)")
    args = p.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.default_fit_budgets = [float(b) for b in args.default_fit_budgets.split(",") if b.strip()]
    args.default_fit_every = [int(k) for k in args.default_fit_every.split(",") if k.strip()]
    args.default_fit_frameworks = [f.strip() for f in args.default_fit_frameworks.split(",") if f.strip()]
    args.ab_every = [int(k) for k in args.ab_every.split(",") if k.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    deadline = Deadline(args.budget_s)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: use --device cpu", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    root = Path(tempfile.mkdtemp(prefix="autockpt-gpu-bench-", dir=args.dir))
    res = Results(args.json, meta(device, args))
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    res.doc["meta"]["persist_windows_tracked"] = track_persists()
    disk_bps = 1e9
    try:
        fl = floors(device, min(parse_size(args.floor_bytes), max(args.sizes or [64 * 2**20])), root)
        res.doc["floors"] = fl
        disk_bps = fl["disk_write_fsync_GBps"] * 1e9
        print(f"floors: {json.dumps({k: round(v, 2) for k, v in fl.items()})}", flush=True)
    except Exception as exc:
        res.error("floors", exc)
    res.write()
    try:  # CUDA context, cuBLAS handles, Lightning's first-fit costs: not in the first size's baseline
        start = now()
        fit(device, mlp_width(min(args.sizes or [2**20])), 30, None, None, timed_steps=False)
        res.doc["meta"]["warmup_fit_s"] = now() - start
    except Exception as exc:
        res.error("warm-up fit", exc)
    default_size = parse_size(args.default_fit_size) if args.default_fit_size else None
    order: list[tuple[str, int]] = []
    for size in sorted(args.sizes):
        order.append(("modes", size))
        if default_size is not None and size == default_size:
            order.append(("default", size))
    if default_size is not None and default_size not in args.sizes:
        order.insert(min(2, len(order)), ("default", default_size))
    if default_size is not None and "keras" in args.default_fit_frameworks:
        order.insert(order.index(("default", default_size)) + 1, ("keras-default", default_size))
    if default_size is not None and "lightning" not in args.default_fit_frameworks:
        order.remove(("default", default_size))
    for kind, size in order:
        name = f"{kind}/{fmt_size(size)}"
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0]
            if size * 3 > free:  # parameters, grads, moments, a reserved copy
                res.skip(name, f"needs ~{fmt_size(size * 3)} of GPU memory, {fmt_size(free)} free")
                continue
        if deadline.left() < 15:
            res.skip(name, f"time budget: {deadline.left():.0f}s left")
            continue
        try:
            if kind == "modes":
                modes_section(args, device, size, root, res, deadline, disk_bps)
            else:
                default_fit_section(args, device, size, root, res, deadline,
                                    "keras" if kind == "keras-default" else "lightning")
        except Exception as exc:
            res.error(name, exc)
        res.write()
    res.doc["meta"]["elapsed_s"] = now() - deadline.start
    res.write()
    shutil.rmtree(root, ignore_errors=True)
    print_tables(res.doc)
    return 1 if res.doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
