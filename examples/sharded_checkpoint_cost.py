"""What a sharded model's checkpoints cost the training around them: 2 CPU ranks (gloo), an MLP
sharded by FSDP2 under Lightning's ``ModelParallelStrategy``, one torch thread per rank.

Three fits of ``--steps`` optimizer steps, ``--rounds`` times in alternating order:

- ``none``: no checkpoints;
- ``ModelCheckpoint``: Lightning's own, every ``--every`` steps (``trainer.save_checkpoint``:
  every rank writes its shards with ``torch.distributed.checkpoint.save`` while training
  waits; ``save_top_k=2``);
- ``AutoCheckpoint``: every ``--every`` steps (``every_n_steps``, ``keep_last=2``): every
  rank stages its shards into reused buffers and writes them in the background, rank 0
  commits the directory;
- ``AutoCheckpoint, no checkpoint``: the callback with no checkpoint in the run (what it costs
  per step: the ranks' agreement and the profiling), to tell that apart from the checkpoints.

Measured on rank 0: the wall time of the timed steps (the first 10 steps are not timed) and
its excess over ``none`` per checkpoint; within each run, what the steps around a checkpoint
(the step ending in it and the next one, which overlaps the background write) took beyond
that run's other steps (immune to drift between runs); the time each checkpoint blocked the
training loop (``ModelCheckpoint``'s save; ``AutoCheckpoint``'s hook); the median step.
Prints a table and writes ``--json``.

    python examples/sharded_checkpoint_cost.py --steps 120 --every 10 --rounds 2 --json sharded.json

Lightning starts rank 1 by running this same command (its subprocess launcher).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

torch.set_num_threads(1)

import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.strategies import ModelParallelStrategy  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from autockpt_lightning import AutoCheckpoint  # noqa: E402

METHODS = ("none", "AutoCheckpoint, no checkpoint", "ModelCheckpoint", "AutoCheckpoint")
UNTIMED = 10


class ShardedMlp(pl.LightningModule):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


class TimedModelCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, timing each save (what the training loop waits for)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blocked: list[float] = []

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        start = time.perf_counter()
        super()._save_checkpoint(trainer, filepath)
        self.blocked.append(time.perf_counter() - start)


class StepTimes(pl.Callback):
    """Wall time of each optimizer step on this rank (between consecutive batch ends), by step."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}
        self._last: float | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.times[trainer.global_step] = now - self._last
        self._last = now


def fit(method: str, args: argparse.Namespace, root: str) -> tuple[dict[int, float], list[float], int, int]:
    """One fit; returns this rank's step times by step, the time each checkpoint blocked the
    training loop, the state bytes of one checkpoint, and the rank."""
    pl.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64 * (args.steps + 1), 64, generator=gen)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=64)
    timer = StepTimes()
    callbacks: list[pl.Callback] = [timer]
    dirpath = os.path.join(root, f"{method}-{time.time_ns()}")
    native = auto = None
    if method == "ModelCheckpoint":
        native = TimedModelCheckpoint(dirpath, every_n_train_steps=args.every, save_top_k=2, monitor="step", mode="max")
        callbacks.insert(0, native)
    if method.startswith("AutoCheckpoint"):
        every = args.every if method == "AutoCheckpoint" else 10 * args.steps
        auto = AutoCheckpoint(dirpath, every_n_steps=every, keep_last=2, save_on_train_end=False, verbose=False)
        callbacks.insert(0, auto)
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=method == "ModelCheckpoint",
        default_root_dir=root,
        callbacks=callbacks,
    )
    model = ShardedMlp(args.width, args.depth)
    trainer.fit(model, data)
    params = sum(p.numel() for p in model.parameters())  # the whole model (DTensor numel is global)
    state_bytes = params * 4 * 3  # fp32 weights and Adam's two moments
    blocked = native.blocked if native is not None else [e.stall_s for e in auto.events] if auto is not None else []
    return timer.times, blocked, state_bytes, trainer.global_rank


def summarize(times: dict[int, float], blocked: list[float], every: int) -> dict[str, float]:
    timed = {step: t for step, t in times.items() if step > UNTIMED}
    around = [t for step, t in timed.items() if step % every in (0, 1)]  # the checkpoint's step and the next
    others = [t for step, t in timed.items() if step % every not in (0, 1)]
    checkpoints = sum(1 for step in timed if step % every == 0)
    return {
        # within one run (immune to drift between runs): what the steps around each checkpoint
        # took beyond that run's other steps
        "excess_around_checkpoint_s": (sum(around) - len(around) * statistics.mean(others)) / checkpoints,
        "blocked_median_s": statistics.median(blocked) if blocked else 0.0,
        "total_s": sum(timed.values()),
        "median_step_s": statistics.median(timed.values()),
        "around_checkpoint_mean_s": statistics.mean(around),
        "other_steps_mean_s": statistics.mean(others),
        "checkpoint_steps": float(sum(1 for step in timed if step % every == 0)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    root = os.environ.setdefault("AUTOCKPT_SHARDED_ROOT", tempfile.mkdtemp(prefix="sharded-"))
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    rank, state_bytes = 0, 0
    for round_ in range(args.rounds):
        order = METHODS if round_ % 2 == 0 else tuple(reversed(METHODS))
        for method in order:
            times, blocked, state_bytes, rank = fit(method, args, root)
            runs[method].append(summarize(times, blocked, args.every))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # torch asks for it before exit; Lightning does not
    if rank != 0:
        return 0
    med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in runs[m][0]} for m in METHODS}
    base = med["none"]["total_s"]
    for m in METHODS:
        extra = med[m]["total_s"] - base
        med[m]["extra_s"] = extra
        med[m]["extra_per_checkpoint_s"] = extra / med[m]["checkpoint_steps"]  # for the no-checkpoint run too
        med[m]["slowdown"] = med[m]["total_s"] / base - 1.0
    result = {
        "machine": f"{os.cpu_count()} CPUs, torch {torch.__version__}, lightning {pl.__version__}",
        "ranks": 2,
        "backend": "gloo",
        "model": f"MLP width {args.width} depth {args.depth}, FSDP2 over 2 ranks",
        "checkpoint_state_mb": state_bytes / 1e6,
        "steps": args.steps,
        "untimed_steps": UNTIMED,
        "every": args.every,
        "rounds": args.rounds,
        "median_over_rounds": med,
        "per_round": runs,
    }
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Sharded model (FSDP2, 2 CPU ranks), {state_bytes / 1e6:.0f} MB of state, a checkpoint every {args.every} steps"
    )
    columns = ("method", "timed steps s", "vs none", "per ckpt ms", "excess around ckpt ms", "blocked ms", "median step ms")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=column == "method")
    for m in METHODS:
        r = med[m]
        table.add_row(
            m,
            f"{r['total_s']:.2f}",
            f"{r['slowdown'] * 100:+.1f}%" if m != "none" else "",
            f"{r['extra_per_checkpoint_s'] * 1e3:.0f}" if m not in ("none", METHODS[1]) else "",
            f"{r['excess_around_checkpoint_s'] * 1e3:.0f}",
            f"{r['blocked_median_s'] * 1e3:.0f}" if r["blocked_median_s"] else "",
            f"{r['median_step_s'] * 1e3:.1f}",
        )
    Console(width=160).print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
