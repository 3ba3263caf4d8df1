"""Canaries for every private Lightning name the adapter reads (``autockpt_lightning.internals``),
and what a release that renamed one would do.

Run against a new Lightning before listing it as tested: ``python -m pytest tests/compat``.

1. Each name exists on the installed Lightning with the shape the adapter expects, read from a
   real fit at the hook where the adapter reads it.
2. Each name renamed (simulated: the door looks for another attribute name) gives a named
   error at ``fit()``'s start (names autockpt cannot run without) or a named warning and a fit
   that still trains, saves and resumes, never an ``AttributeError``.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from autockpt_core import AutockptError, ResumeNotExactWarning  # noqa: E402
from autockpt_lightning import AutoCheckpoint, ResumableSampler, internals  # noqa: E402
from autockpt_lightning import resume as lightning_resume  # noqa: E402
from tests.lightning.lightning_helpers import TinyModel, make_trainer  # noqa: E402


class ShuffledData(pl.LightningDataModule):
    """64 samples in batches of 4 through a ResumableSampler: 16 steps per epoch."""

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=gen)
        dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
        return DataLoader(dataset, batch_size=4, sampler=ResumableSampler(dataset, shuffle=True, seed=0))


class Reader(pl.Callback):
    """At the first training batch's end: what each internal's holder gives."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.seen:
            return
        loop, connector, signals = trainer.fit_loop, trainer._checkpoint_connector, trainer._signal_connector
        self.seen = {
            "checkpoint_connector": trainer._checkpoint_connector,
            "loaded_checkpoint": connector._loaded_checkpoint,
            "restore_modules_and_callbacks": type(connector)._restore_modules_and_callbacks,
            "combined_loader": loop._combined_loader,
            "data_fetcher": loop._data_fetcher,
            "ready_batches_reached": loop.epoch_loop._num_ready_batches_reached(),
            "should_check_val": loop.epoch_loop._should_check_val_fx(loop._data_fetcher),
            "signal_connector": signals,
            "sigterm_notifier": type(signals)._sigterm_notifier_fn,
            "original_handlers": signals._original_handlers,
            "accelerator_connector": trainer._accelerator_connector,
            "val_loop": loop.epoch_loop.val_loop,
        }


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    reader = Reader()
    root = tmp_path_factory.mktemp("canary")
    trainer = make_trainer(root, [AutoCheckpoint(dirpath=str(root / "ckpt"), every_n_steps=2), reader], max_steps=3)
    trainer.fit(TinyModel(), ShuffledData())
    return reader.seen


SHAPES = {
    "checkpoint_connector": lambda v: callable(getattr(v, "dump_checkpoint", None)),
    "loaded_checkpoint": lambda v: isinstance(v, dict),
    "restore_modules_and_callbacks": lambda v: "checkpoint_path" in inspect.signature(v).parameters,
    "combined_loader": lambda v: isinstance(v.flattened, list) and isinstance(v.flattened[0], DataLoader),
    "data_fetcher": lambda v: hasattr(v, "batches") and hasattr(v, "prefetch_batches"),
    "ready_batches_reached": lambda v: v is False,  # the first of 16 batches
    "should_check_val": lambda v: v is False,  # no validation
    "signal_connector": lambda v: v is not None,
    "sigterm_notifier": lambda v: list(inspect.signature(v).parameters)[1:2] == ["signum"],
    "original_handlers": lambda v: isinstance(v, dict),
    "accelerator_connector": lambda v: hasattr(v, "cluster_environment"),
    "val_loop": lambda v: callable(getattr(v, "run", None)) and hasattr(v, "restarted_mid_evaluation"),
}


@pytest.mark.parametrize("key", sorted(SHAPES))
def test_canary_the_internal_is_there_with_its_shape(key: str, seen: dict[str, Any]) -> None:
    assert key in internals.INTERNALS and SHAPES[key](seen[key]), internals.INTERNALS[key].label


def test_canary_the_strategys_and_the_samplers_internals() -> None:
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from lightning.pytorch.strategies import ModelParallelStrategy

    assert internals.saves_distributed_checkpoint(ModelParallelStrategy()) is True
    assert internals.metadata_filename() == "meta.pt"
    sampler = torch.utils.data.RandomSampler(range(10))
    wrapper = DistributedSamplerWrapper(sampler, num_replicas=2, rank=0)
    assert internals.wrapped_sampler(wrapper.dataset) is sampler


def test_every_internal_has_a_canary() -> None:
    checked_apart = {"save_distributed_checkpoint", "metadata_filename", "wrapped_sampler"}
    assert set(internals.INTERNALS) == set(SHAPES) | checked_apart


# -- a release that renamed one ----------------------------------------------------------------


def _renamed(monkeypatch: pytest.MonkeyPatch, key: str) -> internals.Internal:
    original = internals.INTERNALS[key]
    monkeypatch.setitem(internals.INTERNALS, key, dataclasses.replace(original, attr=original.attr + "_renamed"))
    return original


def _fit(root: Path, max_steps: int) -> tuple[pl.Trainer, AutoCheckpoint]:
    auto = AutoCheckpoint(dirpath=str(root / "ckpt"), every_n_steps=3)
    trainer = make_trainer(root, [auto], max_steps=max_steps)
    trainer.fit(TinyModel(), ShuffledData())
    return trainer, auto


REQUIRED = sorted(k for k, i in internals.INTERNALS.items() if i.required and k != "metadata_filename")
OPTIONAL = sorted(k for k, i in internals.INTERNALS.items() if not i.required and k in SHAPES)


@pytest.mark.parametrize("key", REQUIRED)
def test_a_renamed_required_internal_stops_the_fit_at_its_start_naming_it(
    key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = _renamed(monkeypatch, key)
    with pytest.raises(AutockptError, match=f"cannot run on Lightning .*{original.label}"):
        _fit(tmp_path, max_steps=4)
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


@pytest.mark.parametrize("key", OPTIONAL)
def test_a_renamed_internal_is_named_and_the_fit_trains_saves_and_resumes(
    key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = _renamed(monkeypatch, key)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="autockpt"):
        warnings.simplefilter("always")
        first, auto = _fit(tmp_path, max_steps=7)  # checkpoints at 3 and 6, the final one at 7
        second, _ = _fit(tmp_path, max_steps=10)  # resumes at 7, mid-epoch
    told = [str(w.message) for w in caught if issubclass(w.category, ResumeNotExactWarning)]
    told += [r.getMessage() for r in caplog.records]
    assert any(original.label in message for message in told), told
    assert first.global_step == 7 and second.global_step == 10
    assert auto.events and max(e.step for e in auto.events) == 7


def test_a_renamed_sampler_wrapper_is_a_named_resume_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    original = _renamed(monkeypatch, "wrapped_sampler")
    wrapper = DistributedSamplerWrapper(torch.utils.data.RandomSampler(range(10)), num_replicas=2, rank=0)
    loader = DataLoader(list(range(10)), sampler=wrapper)
    assert original.label in (lightning_resume.random_sampler_wrapped_for_ranks(loader) or "")


def test_a_renamed_strategy_flag_is_unknown_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.strategies import ModelParallelStrategy

    _renamed(monkeypatch, "save_distributed_checkpoint")
    assert internals.saves_distributed_checkpoint(ModelParallelStrategy()) is None
