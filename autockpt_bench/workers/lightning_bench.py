"""Lightning worker of ``autockpt bench``: one configuration per process (see :mod:`.measure`).

``python -m autockpt_bench.workers.lightning_bench train --method M --bytes N --dir D [--every K] [--checkpoints C]``
    trains a square MLP with Adam whose training state is ~N bytes for ``(C + 1)·K - 1`` steps with
    a checkpoint every K steps (M: ``none``, ``autockpt`` (snapshot_mode "sync", the default
    persist_mode), ``autockpt-overlap``, ``autockpt-auto`` (snapshot_mode "auto": measured),
    ``autockpt-thread`` (persist_mode "thread"),
    ``modelcheckpoint``, ``async`` = ModelCheckpoint with AsyncCheckpointIO) and reports
    per-checkpoint stall, persist time, file size, the mean step time after warm-up, the
    step time of iterations overlapping a background persist vs clean ones, and the peak
    resident memory.
``python -m autockpt_bench.workers.lightning_bench persist --bytes N --dir D [--reps R]``
    times, without training, the copy into reusable buffers and the persist of a
    dump_checkpoint-shaped tree: autockpt's path, the same with torch's zip CRC, plain
    ``torch.save`` + fsync, and Lightning's ``TorchCheckpointIO`` (no fsync).

Stall = time spent in the method's hooks (``on_train_batch_end``, and for autockpt
``on_before_optimizer_step``, where an overlapping copy is waited for), summed per
checkpoint interval (see ``autockpt_bench.workers.measure.stall_figures``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from autockpt_core.persist.storage import LocalStorage

from .hooks import log_calls
from .measure import emit, mlp_layout, overlap_figures, record_persist_windows, stall_figures, step_times, timed
from .stacked_linear import StackedLinear

METHODS = ("none", "autockpt", "autockpt-overlap", "autockpt-auto", "autockpt-thread", "modelcheckpoint", "async")
COPY_MODES = {"autockpt-overlap": "overlap", "autockpt-auto": "auto"}  # the others: "sync"
BATCH = 16


def train(method: str, state_bytes: int, directory: str, every: int, checkpoints: int) -> dict[str, Any]:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO
    from torch.utils.data import DataLoader, TensorDataset

    from autockpt_core.config import Config
    from autockpt_lightning import AutoCheckpoint

    width, layers = mlp_layout(state_bytes)
    total_steps = checkpoints * every + every - 1  # C windows of `every` steps after warm-up, one checkpoint each
    warm = every - 1  # marks from here on: each checkpoint's stall falls in a measured step

    marks: dict[int, float] = {}
    hooks: list[tuple[float, float]] = []
    saves: list[tuple[float, float]] = []  # (start, seconds) of each native save_checkpoint
    windows: list[tuple[float, float]] = []  # background persists: (start, end)

    class WaitForPersistProcess(Callback):
        """Steady state: the first checkpoints would otherwise be written by the writer thread
        while the persist process still imports torch (autockpt_core.persist.persist_process)."""

        def on_train_start(self, trainer: pl.Trainer, *args: Any) -> None:
            session = getattr(tracked, "session", None)  # autockpt only
            if session is not None:
                session.wait_for_persist_process()

    modes: list[str | None] = []  # autockpt: the copy mode of each checkpoint

    class ModeLog(Callback):  # after AutoCheckpoint
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if tracked.events and tracked.events[-1].step == trainer.global_step:
                modes.append(tracked._snapshotter.mode)

    class StepTimer(Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            marks[trainer.global_step] = time.perf_counter()

    class PersistTimer(Callback):
        def on_train_start(self, trainer: pl.Trainer, *args: Any) -> None:
            io = trainer.strategy.checkpoint_io
            inner = getattr(io, "checkpoint_io", None) if isinstance(io, AsyncCheckpointIO) else io
            log_calls(inner, ("save_checkpoint",), saves)

    torch.manual_seed(0)
    x = torch.randn(total_steps * BATCH, width)
    loader = DataLoader(TensorDataset(x, x.clone()), batch_size=BATCH, shuffle=False)
    callbacks: list[Any] = [StepTimer(), WaitForPersistProcess()]
    plugins: list[Any] = []
    tracked: Any = None
    if method.startswith("autockpt"):
        extra: dict[str, Any] = {"signals": ()} if "signals" in {f.name for f in dataclasses.fields(Config)} else {}
        tracked = AutoCheckpoint(
            directory, every_n_steps=every, keep_last=2, resume=False, verbose=False,
            snapshot_mode=COPY_MODES.get(method, "sync"),
            persist_mode="thread" if method == "autockpt-thread" else "auto", **extra,
        )
        record_persist_windows(windows)
        log_calls(tracked, ("on_train_batch_end", "on_before_optimizer_step"), hooks)
        callbacks += [tracked, ModeLog()]
    elif method in ("modelcheckpoint", "async"):
        tracked = ModelCheckpoint(dirpath=directory, every_n_train_steps=every, save_top_k=1, save_last=False)
        log_calls(tracked, ("on_train_batch_end",), hooks)
        callbacks += [tracked, PersistTimer()]
        if method == "async":
            plugins.append(AsyncCheckpointIO())
    elif method != "none":
        raise ValueError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")

    trainer = pl.Trainer(
        max_steps=total_steps, max_epochs=1, accelerator="cpu", devices=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=method in ("modelcheckpoint", "async"), callbacks=callbacks, plugins=plugins,
        num_sanity_val_steps=0,
    )
    model = StackedLinear(width, layers, lr=1e-4)
    trainer.fit(model, loader)
    optimizer = trainer.optimizers[0]
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    nbytes += sum(
        v.numel() * v.element_size() for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)
    )
    result: dict[str, Any] = {
        "case": "train", "framework": "lightning", "method": method, "state_bytes": nbytes,
        "width": width, "layers": layers, "every": every, "steps": total_steps, "warmup": warm,
        **step_times(marks, warm, every),
    }
    if tracked is not None:
        result.update(stall_figures(hooks, marks, warm, every))
        if method == "async":  # AsyncCheckpointIO's saves run in the background
            windows = [(start, start + sec) for start, sec in saves]
        result.update(overlap_figures(marks, hooks, windows, warm))
    if method.startswith("autockpt"):
        session = tracked.session
        est = session.estimates()
        records = session.records()
        result["persist_s"] = est.persist_s
        result["file_bytes"] = records[-1].size if records else None
        result["buffer_peak_bytes"] = session.buffers.peak_bytes
        result["buffer_allocations"] = session.buffers.allocations
        result["copy_mode"] = tracked._snapshotter.mode
        result["copy_modes"] = modes
        choice = tracked._snapshotter.choice
        result["copy_mode_reason"] = choice.reason if choice is not None else None
        trial = tracked._snapshotter.trial
        result["trial_costs_ms"] = (  # [mode, blocked, excess of the steps around it, its noise (sd)]
            [[c.mode, c.stall_s * 1e3, c.excess_s * 1e3, c.excess_sd_s * 1e3] for c in trial.measured] if trial else None
        )
        result["persist_mode"] = session.persist_mode.mode
        result["prefaulted_bytes"] = session.buffers.prefaulted_bytes
        result["process_writes"] = session.process_writes
    elif method in ("modelcheckpoint", "async"):
        files = [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".ckpt")]
        result["persist_s"] = statistics.median(sec for _start, sec in saves) if saves else None
        result["file_bytes"] = max((os.path.getsize(f) for f in files), default=None)
        result["fsync"] = False
    return result


def _ckpt_tree(state_bytes: int) -> dict[str, Any]:
    """A tree shaped like Lightning's dump_checkpoint for the benchmark MLP with Adam."""
    width, layers = mlp_layout(state_bytes)
    state_dict: collections.OrderedDict[str, torch.Tensor] = collections.OrderedDict()
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for i in range(layers):
        for j, shape in enumerate(((width, width), (width,))):
            name = f"net.{2 * i}.{'weight' if j == 0 else 'bias'}"
            state_dict[name] = torch.randn(shape)
            opt_state[len(opt_state)] = {
                "step": torch.tensor(10.0),
                "exp_avg": torch.randn(shape),
                "exp_avg_sq": torch.rand(shape),
            }
    return {
        "epoch": 0,
        "global_step": 10,
        "pytorch-lightning_version": "2.6",
        "state_dict": state_dict,
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 1}}}},
        "callbacks": {},
        "optimizer_states": [{"state": opt_state, "param_groups": [{"lr": 1e-4, "params": list(opt_state)}]}],
        "lr_schedulers": [],
    }


def persist(state_bytes: int, directory: str, reps: int) -> dict[str, Any]:
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    from autockpt_torch import save_tree, snapshot_tree, torch_buffer_pool

    tree = _ckpt_tree(state_bytes)
    pool = torch_buffer_pool()

    def snap() -> Any:
        pool.begin_round()
        copy, _ = snapshot_tree(tree, pool)
        pool.end_round()
        return copy

    copy = snap()  # allocates and touches the buffers
    nbytes = pool.total_bytes
    snapshot_s = timed(snap, max(3, reps))
    storage = LocalStorage(directory)
    sizes: dict[str, int] = {}

    def autockpt_write(zip_crc32: bool) -> Callable[[], None]:
        def run() -> None:
            name = f"bench-{zip_crc32}.ckpt"
            sizes[f"autockpt_zipcrc_{zip_crc32}"] = storage.write_atomic(
                name, lambda f: save_tree(copy, f, zip_crc32=zip_crc32)
            ).size
            storage.delete(name)

        return run

    path = os.path.join(directory, "bench-plain.ckpt")

    def torch_save_fsync() -> None:
        with open(path, "wb") as f:
            torch.save(copy, f)
            f.flush()
            os.fsync(f.fileno())
        os.unlink(path)

    io = TorchCheckpointIO()

    def lightning_io() -> None:
        io.save_checkpoint(copy, path)
        os.unlink(path)

    return {
        "case": "persist", "framework": "lightning", "state_bytes": nbytes,
        "snapshot_s": statistics.median(snapshot_s),
        "autockpt_ckpt_s": statistics.median(timed(autockpt_write(False), reps)),
        "autockpt_ckpt_zipcrc_s": statistics.median(timed(autockpt_write(True), reps)),
        "torch_save_fsync_s": statistics.median(timed(torch_save_fsync, reps)),
        "lightning_io_s": statistics.median(timed(lightning_io, reps)),
        "file_bytes": sizes.get("autockpt_zipcrc_False"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autockpt_bench.workers.lightning_bench")
    parser.add_argument("case", choices=("train", "persist"))
    parser.add_argument("--method", choices=METHODS, default="autockpt")
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    threads = int(os.environ.get("AUTOCKPT_BENCH_THREADS", "0"))
    if threads > 0:
        torch.set_num_threads(threads)
    if args.case == "train":
        result = train(args.method, args.bytes, args.dir, args.every, args.checkpoints)
    else:
        result = persist(args.bytes, args.dir, args.reps)
    result["torch_threads"] = torch.get_num_threads()
    emit(result)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
