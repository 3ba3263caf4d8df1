"""Small models, data and recorders shared by the Lightning tests (CPU, seconds per fit)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from autockpt_core import Decision

torch.set_num_threads(1)


class TinyModel(pl.LightningModule):
    """A two-layer MLP regressor trained with Adam."""

    def __init__(self, hidden: int = 16, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class ShardedTinyModel(TinyModel):
    """TinyModel sharded by FSDP2 over the data-parallel ranks (for ``ModelParallelStrategy``)."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)


class TinyData(pl.LightningDataModule):
    """Fixed random regression data (seeded), not shuffled; ``stateful`` resumes mid-epoch."""

    def __init__(self, samples: int = 512, batch_size: int = 8, seed: int = 0, stateful: bool = False) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(samples, 8, generator=gen)
        self.y = self.x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(samples, 1, generator=gen)
        self.batch_size = batch_size
        self.stateful = stateful

    def train_dataloader(self) -> DataLoader:
        loader = StatefulDataLoader if self.stateful else DataLoader
        return loader(TensorDataset(self.x, self.y), batch_size=self.batch_size)


class Recorder(pl.Callback):
    """Placed after AutoCheckpoint: records each step's decision and, at chosen steps, the state."""

    def __init__(self, auto: Any, capture_steps: tuple[int, ...] = ()) -> None:
        self.auto = auto
        self.capture_steps = set(capture_steps)
        self.decisions: dict[int, Decision] = {}
        self.captured: dict[int, dict[str, torch.Tensor]] = {}
        self.start_step: int | None = None
        self.start_weights: dict[str, torch.Tensor] = {}
        self.start_exp_avg: list[torch.Tensor] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start_step = trainer.global_step
        self.start_weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        opt = trainer.optimizers[0]
        self.start_exp_avg = [opt.state[p]["exp_avg"].clone() for p in pl_module.parameters() if p in opt.state]

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        session = self.auto.session
        if session is not None and session.last_decision is not None:
            self.decisions[step] = session.last_decision
        if step in self.capture_steps:
            self.captured[step] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}


def make_trainer(root: Any, callbacks: list[pl.Callback], max_steps: int, **kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = dict(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(root),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **options)
