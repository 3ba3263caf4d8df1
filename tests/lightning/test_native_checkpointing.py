"""Lightning's own checkpointing beside autockpt (autockpt_lightning/native_checkpointing.py): the
default ModelCheckpoint is warned about once, its saves' time is in the summary line, and
``trainer.save_checkpoint`` is the trainer's own again after the fit."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from autockpt_lightning import AutoCheckpoint  # noqa: E402
from autockpt_lightning import native_checkpointing  # noqa: E402
from tests.lightning.lightning_helpers import TinyData, TinyModel, make_trainer  # noqa: E402

pytestmark = pytest.mark.integration


def fit(tmp_path: Path, **trainer_options: object) -> tuple[AutoCheckpoint, list[str], object]:
    native_checkpointing._warned = False  # once per process: each case starts afresh
    auto = AutoCheckpoint(tmp_path / "ck", every_n_steps=8, verbose=False)
    extra = trainer_options.pop("callbacks", [])
    trainer = make_trainer(tmp_path, [auto, *extra], max_steps=32, max_epochs=None, **trainer_options)  # type: ignore[list-item]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.fit(TinyModel(), TinyData(samples=64))  # 8 steps an epoch: 4 epochs
    said = [str(w.message) for w in seen if "ModelCheckpoint is on too" in str(w.message)]
    return auto, said, trainer


def test_the_default_model_checkpoint_is_named_once_and_its_saves_are_in_the_summary(tmp_path: Path) -> None:
    auto, said, trainer = fit(tmp_path)
    assert len(said) == 1 and "Trainer(enable_checkpointing=False)" in said[0]
    assert auto.summary is not None
    line = auto.summary.line()
    assert "; beside it, Lightning's ModelCheckpoint saved 4 times in " in line, line  # one per epoch
    assert "save_checkpoint" not in vars(trainer)  # the trainer's own method again
    assert len(list((tmp_path / "checkpoints").glob("*.ckpt"))) == 1  # its files, untouched by autockpt


def test_without_it_or_with_one_configured_there_is_no_warning(tmp_path: Path) -> None:
    auto, said, _ = fit(tmp_path / "off", enable_checkpointing=False)
    assert said == [] and auto.summary is not None and "beside it" not in auto.summary.line()
    configured = ModelCheckpoint(dirpath=tmp_path / "mine-ckpts", every_n_train_steps=16, save_top_k=-1)
    auto, said, _ = fit(tmp_path / "mine", callbacks=[configured])
    assert said == [] and auto.summary is not None
    assert "Lightning's ModelCheckpoint saved 2 times in " in auto.summary.line()  # steps 16 and 32
