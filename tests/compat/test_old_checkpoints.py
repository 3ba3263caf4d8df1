"""Checkpoints written before the core moved into packages still verify, load and resume.

The files in ``data/v0.1-flat-core/`` were written by ``make_checkpoints.py`` at commit
9801bef (flat ``autockpt_core``); nothing in them names a module path, and these tests load
them with the current code: manifest and checksums, the file formats, and auto-resume.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from autockpt_core import find_latest_valid, read_manifest, storage_for, verify
from autockpt_core.cli import main as cli_main

DATA = Path(__file__).parent / "data" / "v0.1-flat-core"


def copy_of(framework: str, tmp_path: Path) -> Path:
    target = tmp_path / framework
    shutil.copytree(DATA / framework, target)
    return target


@pytest.mark.parametrize(("framework", "suffix"), [("lightning", ".ckpt"), ("keras", ".safetensors")])
def test_manifest_and_checksums_verify(framework: str, suffix: str, tmp_path: Path) -> None:
    storage = storage_for(copy_of(framework, tmp_path))
    records = read_manifest(storage)
    assert [r.step for r in records] == [2, 4]
    assert [(r.seq, r.run) for r in records] == [(1, None), (2, None)]  # numbered in their old order
    assert all(r.name.endswith(suffix) and r.framework == framework for r in records)
    assert [verify(storage, r) for r in records] == [None, None]  # None: the file matches its record
    newest = find_latest_valid(storage, framework=framework)
    assert newest is not None and newest.step == 4
    assert cli_main(["inspect", str(tmp_path / framework)]) == 0


@pytest.mark.integration
def test_lightning_resumes_from_an_old_checkpoint(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pl = pytest.importorskip("lightning.pytorch")
    from autockpt_lightning import AutoCheckpoint, latest_checkpoint
    from tests.compat.make_checkpoints import tiny_lightning_module, tiny_loader

    directory = copy_of("lightning", tmp_path)
    path = latest_checkpoint(directory)
    assert path is not None and path.endswith("ckpt-step000000004.ckpt")
    torch.set_num_threads(1)

    saved = torch.load(path, map_location="cpu", weights_only=False)
    loader = tiny_loader()
    callback = AutoCheckpoint(directory, every_n_steps=2, verbose=False)
    model = tiny_lightning_module()
    trainer = pl.Trainer(
        max_steps=4, callbacks=[callback], enable_checkpointing=False, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, loader)  # max_steps already reached: nothing left to train
    assert callback.resumed_from == 4 and trainer.global_step == 4
    assert torch.equal(model.layer.weight, saved["state_dict"]["layer.weight"])
    trainer = pl.Trainer(
        max_steps=6, callbacks=[callback], enable_checkpointing=False, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(tiny_lightning_module(), loader)
    assert callback.resumed_from == 4 and trainer.global_step == 6
    assert [r.step for r in read_manifest(storage_for(directory))][-1] == 6


@pytest.mark.integration
def test_keras_loads_and_resumes_from_an_old_checkpoint(tmp_path: Path) -> None:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    keras = pytest.importorskip("keras")
    import numpy as np

    from autockpt_keras import AutoCheckpoint, latest_checkpoint, load_checkpoint

    directory = copy_of("keras", tmp_path)
    path = latest_checkpoint(directory)
    assert path is not None and path.endswith("ckpt-step000000004.safetensors")
    arrays, info = load_checkpoint(path)
    assert info.step == 4 and info.next_epoch == 1
    kernels = [v for k, v in arrays.items() if "kernel" in k]
    assert kernels and kernels[0].shape == (4, 2)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(1).normal(size=(32, 4)).astype("float32")
    y = np.zeros((32, 2), "float32")
    callback = AutoCheckpoint(directory, every_n_steps=2, verbose=False)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    assert callback.restored is not None and callback.restored.step == 4
    assert int(model.optimizer.iterations.numpy()) == 8
