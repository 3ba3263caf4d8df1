"""Auto-resume reads the checkpoint file once: rank 0 loads it while a helper thread checks its
CRC-32, and Lightning's restore gets what was loaded (autockpt_lightning/verified_load.py)."""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import SingleDeviceStrategy

import autockpt_lightning.verified_load as verified_load
from autockpt_core import read_manifest, storage_for
from autockpt_lightning import AutoCheckpoint
from autockpt_lightning.verified_load import Loaded, fusable, serving
from tests.lightning.lightning_helpers import TinyData, TinyModel, make_trainer


class CountingIO(TorchCheckpointIO):
    """Lightning's own checkpoint IO, recording each file it loads; ``loading`` is set when a
    load begins."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[str] = []
        self.loading = threading.Event()

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        self.loads.append(os.path.basename(path))
        self.loading.set()
        return super().load_checkpoint(path, weights_only=weights_only)


class FirstWeights(pl.Callback):
    """The module's weights when training starts (after the restore)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}


def fit(
    dirpath: Path, tmp_path: Path, io: CountingIO | None = None, **limits: Any
) -> tuple[pl.Trainer, AutoCheckpoint, FirstWeights]:
    torch.manual_seed(0)
    callback = AutoCheckpoint(str(dirpath), every_n_steps=4 if "every" not in limits else limits.pop("every"),
                              verbose=False, signals=())  # fmt: skip
    first = FirstWeights()
    trainer = make_trainer(tmp_path, [callback, first], plugins=[io] if io is not None else None, **limits)
    trainer.fit(TinyModel(), datamodule=TinyData(samples=96))
    return trainer, callback, first


def saved_weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def test_a_resume_loads_the_file_once_while_its_checksum_is_computed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpts = tmp_path / "ck"
    fit(ckpts, tmp_path, max_steps=8)
    io = CountingIO()
    overlapped: list[bool] = []
    verify = verified_load.verify

    def verify_seeing_the_load(storage: Any, record: Any) -> str | None:
        overlapped.append(io.loading.wait(timeout=10))  # times out when the load waits for the verify
        return verify(storage, record)

    monkeypatch.setattr(verified_load, "verify", verify_seeing_the_load)
    trainer, callback, first = fit(ckpts, tmp_path, io, max_steps=12)
    assert callback.resumed_from == 8 and trainer.global_step == 12
    assert io.loads == ["ckpt-step000000008.ckpt"]  # not read a second time by the restore
    assert overlapped == [True]
    for name, value in saved_weights(ckpts / "ckpt-step000000008.ckpt").items():
        assert torch.equal(first.weights[name], value), name
    assert "load_checkpoint" not in vars(trainer.strategy)  # the restore's stand-in is gone


def test_a_corrupt_newest_file_is_loaded_but_never_restored(tmp_path: Path) -> None:
    ckpts = tmp_path / "ck"
    fit(ckpts, tmp_path, max_steps=8)
    newest = ckpts / "ckpt-step000000008.ckpt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum finds it
    newest.write_bytes(bytes(data))
    older = saved_weights(ckpts / "ckpt-step000000004.ckpt")  # retention removes it during the rerun
    io = CountingIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, callback, first = fit(ckpts, tmp_path, io, max_steps=12)
    skipped = [str(w.message) for w in caught if "skipping checkpoint ckpt-step000000008.ckpt" in str(w.message)]
    assert len(skipped) == 1 and "corrupt file" in skipped[0]
    assert callback.resumed_from == 4 and trainer.global_step == 12
    assert io.loads == ["ckpt-step000000008.ckpt", "ckpt-step000000004.ckpt"]
    for name, value in older.items():
        assert torch.equal(first.weights[name], value), name


def test_a_final_checkpoint_the_resume_passes_over_is_only_verified(tmp_path: Path) -> None:
    """96 samples in batches of 8: 12 steps per epoch; the final checkpoint (step 24, an epoch's
    end) is passed over for step 20 when a rerun trains a third epoch."""
    ckpts = tmp_path / "ck"
    fit(ckpts, tmp_path, max_steps=-1, max_epochs=2, every=5)
    final = read_manifest(storage_for(str(ckpts)))[-1]
    assert (final.step, final.meta["continues_exactly"]) == (24, False)
    io = CountingIO()
    trainer, callback, _ = fit(ckpts, tmp_path, io, max_steps=-1, max_epochs=3, every=5)
    assert callback.resumed_from == 20
    assert io.loads == ["ckpt-step000000020.ckpt"]


class OwnLoadStrategy(SingleDeviceStrategy):
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        return super().load_checkpoint(checkpoint_path, weights_only=weights_only)


def test_only_the_strategies_whose_load_has_no_collective_load_while_picking(tmp_path: Path) -> None:
    plain = make_trainer(tmp_path, [], max_steps=1)
    own = make_trainer(tmp_path, [], max_steps=1, strategy=OwnLoadStrategy(device=torch.device("cpu")))
    assert fusable(plain, sharded=False)
    assert not fusable(plain, sharded=True)
    assert not fusable(own, sharded=False)  # e.g. FSDP's broadcasts the path inside its load


def test_serving_hands_over_what_was_loaded_once_and_then_steps_aside(tmp_path: Path) -> None:
    strategy = SingleDeviceStrategy(device=torch.device("cpu"))
    other = tmp_path / "other.ckpt"
    torch.save({"from": "file"}, other)
    with serving(strategy, "/ck/a.ckpt", Loaded("a.ckpt", {"from": "memory"}, None)):
        assert strategy.load_checkpoint(Path("/ck/a.ckpt")) == {"from": "memory"}
        assert strategy.load_checkpoint(str(other)) == {"from": "file"}  # another file: read
        with pytest.raises(FileNotFoundError):
            strategy.load_checkpoint("/ck/a.ckpt")  # served once; a second call reads the file
    assert "load_checkpoint" not in vars(strategy)
    refused = RuntimeError("refused")
    with serving(strategy, "/ck/a.ckpt", Loaded("a.ckpt", None, refused)):
        with pytest.raises(RuntimeError, match="refused"):
            strategy.load_checkpoint("/ck/a.ckpt")  # raised where Lightning's own load would raise
    assert "load_checkpoint" not in vars(strategy)
