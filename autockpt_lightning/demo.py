"""``python -m autockpt_lightning.demo --dirpath D --budget 2%``: watch the policy at work.

Trains a small MLP on synthetic regression data (random tensors, fixed seed) on the CPU with
:class:`AutoCheckpoint` and prints what the policy measured and decided: every checkpoint's
step, reason, interval and stall, then the profiler's estimates and the summary line. All
numbers are measured in this run. Rerunning with the same ``--dirpath`` resumes (raise
``--steps``, also a flag of ``autockpt demo``, to train further).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any, Sequence

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from autockpt_core import Preempted
from autockpt_core.units import format_size
from autockpt_lightning import AutoCheckpoint

FEATURES = 64


class DemoMLP(pl.LightningModule):
    """An MLP regressor (``layers`` hidden layers of width ``hidden``) trained with Adam."""

    def __init__(self, hidden: int = 1024, layers: int = 4, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        blocks: list[nn.Module] = []
        width = FEATURES
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        blocks.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*blocks)
        self.lr = lr

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def synthetic_loader(samples: int, batch_size: int, seed: int) -> StatefulDataLoader:
    """Random inputs and a fixed random linear target plus noise (resumable mid-epoch)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=gen)
    w = torch.randn(FEATURES, 1, generator=gen)
    y = x @ w + 0.1 * torch.randn(samples, 1, generator=gen)
    return StatefulDataLoader(TensorDataset(x, y), batch_size=batch_size)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autockpt_lightning.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dirpath", default="autockpt-demo/lightning", help="checkpoint directory")
    parser.add_argument("--budget", default="2%", help="overhead budget, e.g. 2%% or 0.02")
    parser.add_argument("--mtbf", default=None, help="mean time between failures (e.g. 6h); enables Young/Daly")
    parser.add_argument("--steps", type=int, default=500, help="optimizer steps to train (max_steps)")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden width (sets the checkpoint size)")
    parser.add_argument("--layers", type=int, default=4, help="hidden layers")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    pl.seed_everything(args.seed, verbose=False)
    model = DemoMLP(hidden=args.hidden, layers=args.layers)
    params = sum(p.numel() for p in model.parameters())
    auto = AutoCheckpoint(args.dirpath, overhead_budget=args.budget, mtbf=args.mtbf, verbose=False)
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=1,
        callbacks=[auto],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.dirpath,
    )
    print(
        f"autockpt demo: MLP {args.layers}x{args.hidden}, {params:,} parameters "
        f"(weights + Adam state ~{format_size(params * 4 * 3)}), {args.steps} steps, "
        f"budget {args.budget}, mtbf {args.mtbf or 'not set'} -> {args.dirpath}",
        flush=True,
    )
    with warnings.catch_warnings():
        # Deprecation notices from inside torchdata and Lightning, not about this program.
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
        loader = synthetic_loader(samples=args.batch_size * 64, batch_size=args.batch_size, seed=args.seed)
        try:
            trainer.fit(model, train_dataloaders=loader)
        except Preempted as stop:
            print(stop.describe(args.dirpath), flush=True)
            return int(stop.code)  # type: ignore[arg-type]  # 128 + the signal's number
    report(auto, args.steps)
    return 0


def report(auto: AutoCheckpoint, steps: int) -> None:
    """Print each checkpoint's decision and cost, then the profiler's estimates; for a rerun
    that found its ``steps`` already trained, what to do instead."""
    session = auto.session
    if session is None:
        return
    if auto.resumed_from is not None and auto.resumed_from >= steps:
        print(f"nothing left to train: the checkpoint of step {auto.resumed_from} already reached --steps {steps}; "
              f"rerun with --steps {2 * steps} to train further, or another --dirpath to start over")
        return
    if auto.resumed_from is not None:
        print(f"resumed from step {auto.resumed_from} (rerun with a larger --steps to train further)")
    print("checkpoints (step: reason | interval in force | stall | size):")
    for e in auto.events:
        interval = f"{e.interval_steps} steps ({e.interval_rule})" if e.interval_steps is not None else "not chosen yet"
        print(f"  {e.step:6d}: {e.reason} | {interval} | {e.stall_s * 1e3:.1f} ms | {format_size(e.nbytes)}")
    est = session.estimates()

    def ms(value: float | None) -> str:
        return f"{value * 1e3:.2f} ms" if value is not None else "n/a"

    slowdown = est.background_slowdown
    overlap = f"{slowdown * 100:.0f}% slower (mean)" if slowdown is not None else "n/a"
    print(
        f"measured: iteration {ms(est.iter_time_s)}, stall {ms(est.stall_s)}, persist {ms(est.persist_s)} "
        f"(medians); iterations overlapping a persist {overlap}"
    )
    if session.policy.current is not None:
        print(f"interval now: {session.policy.current.explain()}")
    print(session.summary().line())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
