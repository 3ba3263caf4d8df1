"""planned_end_step in real fits: the step each Trainer setup ends after reaches the policy."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from autockpt_lightning import AutoCheckpoint

from .lightning_helpers import TinyData, TinyModel, make_trainer

pytestmark = pytest.mark.integration


class Stream(IterableDataset):
    """An iterable dataset: Lightning cannot know the epoch's length."""

    def __iter__(self) -> Any:
        gen = torch.Generator().manual_seed(0)
        for _ in range(12):
            x = torch.randn(8, 8, generator=gen)
            yield x, x.sum(dim=1, keepdim=True)


@pytest.mark.parametrize(
    ("trainer_kwargs", "data", "expected"),
    [
        ({"max_steps": 7}, "tiny", 7),
        ({"max_steps": -1, "max_epochs": 2}, "tiny", 20),  # 80 samples in batches of 8: 10 a epoch
        ({"max_steps": -1, "max_epochs": 2, "accumulate_grad_batches": 3}, "tiny", 8),  # ceil(10 / 3) a epoch
        ({"max_steps": 30, "max_epochs": 2}, "tiny", 20),  # whichever comes first
        ({"max_steps": -1, "max_epochs": 1}, "stream", None),  # unknown length, no max_steps
    ],
)
def test_the_policy_learns_the_planned_end(
    tmp_path: Any, trainer_kwargs: dict[str, Any], data: str, expected: int | None
) -> None:
    auto = AutoCheckpoint(tmp_path / "ck", verbose=False, resume=False)
    trainer = make_trainer(tmp_path, [auto], **trainer_kwargs)
    if data == "tiny":
        trainer.fit(TinyModel(), datamodule=TinyData(samples=80))
    else:
        trainer.fit(TinyModel(), train_dataloaders=DataLoader(Stream(), batch_size=None))
    assert auto.session is not None and auto.session.policy.end_step == expected


def test_no_final_checkpoint_no_planned_end(tmp_path: Any) -> None:
    auto = AutoCheckpoint(tmp_path / "ck", verbose=False, resume=False, save_on_train_end=False)
    make_trainer(tmp_path, [auto], max_steps=7).fit(TinyModel(), datamodule=TinyData(samples=80))
    assert auto.session is not None and auto.session.policy.end_step is None
