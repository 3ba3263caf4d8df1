"""The Lightning adapter's persist process and warm buffers (no cold start), really trained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from autockpt_core.persist.shared_memory import shared_memory_supported
from autockpt_lightning import AutoCheckpoint
from tests.lightning.lightning_helpers import Recorder, TinyData, TinyModel, make_trainer


class WaitForPersistProcess(pl.Callback):
    def __init__(self, auto: AutoCheckpoint) -> None:
        self.auto = auto

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self.auto.session is not None and self.auto.session.wait_for_persist_process(60)


def state_bytes(trainer: pl.Trainer) -> int:
    tensors = list(trainer.lightning_module.state_dict().values())
    tensors += [v for s in trainer.optimizers[0].state.values() for v in s.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.skipif(not shared_memory_supported(), reason="needs os.memfd_create (Linux)")
def test_checkpoints_are_written_by_the_persist_process_from_prefaulted_buffers(tmp_path: Path) -> None:
    auto = AutoCheckpoint(tmp_path / "ckpts", every_n_steps=5, save_on_train_end=False)
    recorder = Recorder(auto, capture_steps=(5, 10, 15))
    trainer = make_trainer(tmp_path, [auto, WaitForPersistProcess(auto), recorder], max_steps=17)
    trainer.fit(TinyModel(), TinyData())
    session = auto.session
    assert session is not None and session.persist_mode.mode == "process"
    assert [e.step for e in auto.events] == [5, 10, 15] and session.process_writes == 3
    assert session.buffers.prefaulted_bytes >= state_bytes(trainer)  # none allocated by a checkpoint
    for step in (5, 10, 15):
        saved = torch.load(tmp_path / "ckpts" / f"ckpt-step{step:09d}.ckpt", weights_only=False)
        for key, value in recorder.captured[step].items():
            assert torch.equal(saved["state_dict"][key], value), (step, key)


class Unfreeze(pl.Callback):
    """Trains ``net.0`` only from step ``at`` on: Adam creates its state there (the state grows)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pl_module.net[0].requires_grad_(False)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.at:
            pl_module.net[0].requires_grad_(True)


@pytest.mark.parametrize("persist_mode", ["thread", "auto"])
def test_buffers_for_a_grown_state_are_prefaulted_before_the_next_checkpoint(tmp_path: Path, persist_mode: str) -> None:
    auto = AutoCheckpoint(tmp_path / "ckpts", every_n_steps=6, save_on_train_end=False, persist_mode=persist_mode)
    trainer = make_trainer(tmp_path, [auto, Unfreeze(at=8)], max_steps=13)
    trainer.fit(TinyModel(), TinyData())
    session = auto.session
    assert session is not None and [e.step for e in auto.events] == [6, 12]
    assert len(trainer.optimizers[0].state) == 4  # net.0's weight and bias joined at step 9
    assert session.buffers.prefaulted_bytes >= state_bytes(trainer)
