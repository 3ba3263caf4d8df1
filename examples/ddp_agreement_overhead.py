"""What the per-step agreement costs under DDP: 2 CPU ranks (gloo), one process each.

Every optimizer step, AutoCheckpoint's ranks agree in one all-reduce of six float64 numbers
(rank 0's checkpoint decision, any rank's signal and failure, the slowest rank's step and
checkpoint times). This script trains a small MLP (one torch thread per rank) for ``--steps``
steps, ``--rounds`` times in alternating order: without the callback, and with it but with
no checkpoint in the timed steps (``every_n_steps`` beyond the run, no final checkpoint), so
the difference is the agreement and the per-step profiling. It also times every ``agree()``
call itself on both ranks. Prints a table and writes ``--json``.

    python examples/ddp_agreement_overhead.py --steps 400 --rounds 3 --json agreement.json

Lightning starts rank 1 by running this same command (its subprocess launcher).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
from agreement_report import report  # examples/ (the script's directory is on sys.path)

torch.set_num_threads(1)

import lightning.pytorch as pl  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from autockpt_lightning import AutoCheckpoint  # noqa: E402
from autockpt_lightning.distributed import LightningRanks  # noqa: E402


class Mlp(pl.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class StepTimes(pl.Callback):
    """Wall time between consecutive optimizer-step ends (this rank)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._last: float | None = None

    def on_train_batch_end(self, *args: Any) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now


def timed_agree(calls: list[float]) -> Any:
    """LightningRanks.agree (the per-step agreement), timing each call into ``calls``."""
    agree = LightningRanks.agree

    def wrapper(self: LightningRanks, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return agree(self, **kwargs)
        finally:
            calls.append(time.perf_counter() - start)

    return wrapper


def fit(method: str, steps: int, width: int, root: str) -> tuple[list[float], list[float], int]:
    """One fit; returns this rank's step times (first 20 dropped), agree() times, and the rank."""
    pl.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=gen)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=32)
    timer = StepTimes()
    calls: list[float] = []
    callbacks: list[pl.Callback] = [timer]
    if method == "autockpt":
        LightningRanks.agree = timed_agree(calls)  # type: ignore[method-assign]  # main() puts it back
        auto = AutoCheckpoint(
            os.path.join(root, method), every_n_steps=10 * steps, save_on_train_end=False, verbose=False, resume=False
        )
        callbacks.insert(0, auto)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
        callbacks=callbacks,
    )
    trainer.fit(Mlp(width), data)
    return timer.times[20:], calls[20:], trainer.global_rank


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    root = os.environ.setdefault("AUTOCKPT_AGREEMENT_ROOT", tempfile.mkdtemp(prefix="agreement-"))
    steps: dict[str, list[float]] = {"none": [], "autockpt": []}
    agree_s: list[float] = []
    rank = 0
    original = LightningRanks.agree
    for round_ in range(args.rounds):
        order = ["none", "autockpt"] if round_ % 2 == 0 else ["autockpt", "none"]
        for method in order:
            times, calls, rank = fit(method, args.steps, args.width, root)
            LightningRanks.agree = original  # type: ignore[method-assign]
            steps[method].append(statistics.median(times))
            agree_s.extend(calls)
    if rank != 0:
        return 0
    facts = {
        "machine": f"{os.cpu_count()} CPUs, torch {torch.__version__}, lightning {pl.__version__}",
        "ranks": 2,
        "backend": "gloo",
        "steps": args.steps,
        "rounds": args.rounds,
        "width": args.width,
    }
    report("DDP, 2 CPU ranks (gloo): the per-step agreement", steps, agree_s, facts, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
