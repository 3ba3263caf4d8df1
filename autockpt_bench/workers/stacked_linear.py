"""The model of the snapshot benchmarks: ``layers`` square Linear layers (ReLU between) trained
with Adam on a mean-squared error, so parameters plus Adam's two moments are three copies of
``layers × width²`` floats: a state of a chosen size with nothing else in the step.

Used by ``autockpt bench`` (:mod:`.lightning_bench`, CPU) and ``examples/gpu_benchmark.py`` (CUDA).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

__all__ = ["StackedLinear"]


class StackedLinear(pl.LightningModule):
    """``layers`` Linear(width, width) with ReLU between, Adam(lr), MSE against the batch's target."""

    def __init__(self, width: int, layers: int, lr: float) -> None:
        super().__init__()
        blocks: list[torch.nn.Module] = []
        for i in range(layers):
            blocks.append(torch.nn.Linear(width, width))
            if i < layers - 1:
                blocks.append(torch.nn.ReLU())
        self.net = torch.nn.Sequential(*blocks)
        self.lr = lr

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)
