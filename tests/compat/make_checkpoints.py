"""Write the small checkpoints in ``tests/compat/data/`` (run once per released layout).

``python tests/compat/make_checkpoints.py lightning|keras OUTDIR``: trains a tiny model for 4
optimizer steps with ``AutoCheckpoint(every_n_steps=2)`` through the public API only, so the
same script runs on any autockpt version. The files in ``data/v0.1-flat-core/`` were written
by this script at commit 9801bef (the flat ``autockpt_core`` of 33 modules, before the move
into ``policy/``, ``persist/`` and ``cli/``); ``test_old_checkpoints.py`` loads them with the
current code.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def tiny_lightning_module() -> Any:
    """A LightningModule with one ``Linear(4, 2)`` trained with Adam on an MSE loss."""
    import lightning.pytorch as pl
    import torch

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=0.01)

    return Tiny()


def tiny_loader() -> Any:
    """64 random samples in batches of 8, shuffled by a ResumableSampler."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from autockpt_lightning import ResumableSampler

    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    return DataLoader(data, batch_size=8, sampler=ResumableSampler(data, seed=0))


def lightning(out: str) -> None:
    import lightning.pytorch as pl
    import torch

    from autockpt_lightning import AutoCheckpoint

    torch.manual_seed(0)
    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_steps=4, callbacks=[AutoCheckpoint(out, every_n_steps=2, keep_last=2, verbose=False)],
        enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(tiny_lightning_module(), tiny_loader())


def keras_(out: str) -> None:
    import keras
    import numpy as np

    from autockpt_keras import AutoCheckpoint

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    x, y = np.random.default_rng(0).normal(size=(2, 32, 4)).astype("float32")[0], np.zeros((32, 2), "float32")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[AutoCheckpoint(out, every_n_steps=2, keep_last=2, verbose=False, save_on_train_end=False)])


if __name__ == "__main__":
    which, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    {"lightning": lightning, "keras": keras_}[which](out)
