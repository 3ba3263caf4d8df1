"""The first checkpoint of a fit is checked for objects a weights-only resume refuses
(``autockpt_lightning/trust_check.py``): warned when it is taken, not days later at a resume."""

from __future__ import annotations

import argparse
import pathlib
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from autockpt_lightning import AutoCheckpoint
from autockpt_lightning.trust_check import UnloadableCheckpointWarning, refused_by_weights_only
from tests.lightning.lightning_helpers import TinyData, TinyModel, make_trainer

torch.set_num_threads(1)


class WithNamespace(TinyModel):
    """Hyperparameters a script built with argparse and pathlib."""

    def __init__(self, args: argparse.Namespace | None = None, out: pathlib.Path | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()


def fit(tmp_path: Path, model: TinyModel, **settings: Any) -> list[warnings.WarningMessage]:
    callback = AutoCheckpoint(str(tmp_path / "ck"), every_n_steps=4, warmup_steps=0, verbose=False, **settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback], max_steps=8, enable_checkpointing=False).fit(model, datamodule=TinyData())
    return [w for w in caught if issubclass(w.category, UnloadableCheckpointWarning)]


def test_a_namespace_and_a_path_in_the_hyperparameters_are_named_at_the_first_checkpoint(tmp_path: Path) -> None:
    model = WithNamespace(argparse.Namespace(lr=0.1), pathlib.Path("/data"))
    caught = fit(tmp_path, model)
    assert len(caught) == 1  # once per fit, at the first checkpoint
    text = str(caught[0].message)
    assert "step 4" in text and "argparse.Namespace" in text and "pathlib" in text
    assert "add_safe_globals([" in text and "allow_pickle=True" in text


def test_plain_hyperparameters_allowed_classes_and_allow_pickle_are_not_warned_about(tmp_path: Path) -> None:
    assert fit(tmp_path / "plain", TinyModel()) == []
    model = WithNamespace(argparse.Namespace(lr=0.1), None)
    assert fit(tmp_path / "pickle", model, allow_pickle=True) == []
    with torch.serialization.safe_globals([argparse.Namespace]):
        assert refused_by_weights_only({"hyper": argparse.Namespace(lr=0.1), "w": torch.ones(3)}) == []
    assert refused_by_weights_only({"hyper": argparse.Namespace(lr=0.1)}) == ["argparse.Namespace"]


@pytest.mark.parametrize("tree", [{"w": torch.ones(1000, 1000)}, [torch.zeros(2), {"n": 3, "s": "x"}]])
def test_tensors_and_plain_containers_are_allowed(tree: Any) -> None:
    assert refused_by_weights_only(tree) == []
