"""autockpt + Lightning in two lines: ``python examples/lightning_quickstart.py``.

Trains a small MLP on random data for 400 steps on the CPU. autockpt measures what a
checkpoint costs and checkpoints as often as a 5% overhead budget allows. Interrupt it
(Ctrl-C): autockpt commits a checkpoint of the step it is in and exits with status 130 (a
second Ctrl-C stops at once). Rerun: training resumes from the newest valid checkpoint in
``ckpts/`` (after ``kill -9``, from the last periodic one).
"""

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader  # resumes mid-epoch exactly

from autockpt_lightning import AutoCheckpoint  # line 1


class Regressor(pl.LightningModule):
    def __init__(self, hidden: int = 256) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    pl.seed_everything(0)
    x = torch.randn(4096, 32)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(4096, 1)
    loader = StatefulDataLoader(TensorDataset(x, y), batch_size=32)
    trainer = pl.Trainer(
        max_steps=400,
        accelerator="cpu",
        callbacks=[AutoCheckpoint("ckpts", overhead_budget="5%")],  # line 2
    )
    trainer.fit(Regressor(), loader)  # no ckpt_path needed: reruns resume by themselves


if __name__ == "__main__":
    main()
