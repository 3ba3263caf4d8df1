"""The trust boundary of a Lightning resume: checkpoints are loaded weights only.

The manifest's CRC-32 finds torn and corrupted files, not forged ones: whoever can write
``dirpath`` (or the mirror) can list a file of their own. Here such a file, with a valid record,
carries a pickle that runs a command when it is unpickled.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from autockpt_core import read_manifest
from autockpt_core.persist import LocalStorage
from autockpt_core.persist.manifest import write_manifest
from autockpt_lightning import AutoCheckpoint
from autockpt_lightning.auto_resume import UntrustedCheckpointError
from tests.lightning.lightning_helpers import TinyData, TinyModel, make_trainer

pytestmark = pytest.mark.integration


class RunsCode:
    """Unpickling it runs ``touch MARKER`` (what a planted checkpoint could do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@dataclasses.dataclass
class Settings:
    width: int


def _train(dirpath: Path, root: Path, steps: int, **kwargs: Any) -> AutoCheckpoint:
    auto = AutoCheckpoint(dirpath, every_n_steps=5, verbose=False, **kwargs)
    make_trainer(root, [auto], max_steps=steps).fit(TinyModel(), TinyData(stateful=True))
    return auto


def _replace_newest(dirpath: Path, extra: dict[str, Any]) -> None:
    """Rewrite the newest checkpoint with ``extra`` entries and list it with a valid record."""
    storage = LocalStorage(dirpath)
    records = read_manifest(storage)
    path = dirpath / records[-1].name
    checkpoint = torch.load(path, weights_only=False)
    checkpoint.update(extra)
    torch.save(checkpoint, path)
    data = path.read_bytes()
    records[-1] = dataclasses.replace(records[-1], size=len(data), checksum=f"{zlib.crc32(data) & 0xFFFFFFFF:08x}")
    write_manifest(storage, records)


def test_a_planted_checkpoint_cannot_run_code_and_the_refusal_names_the_objects_and_the_fixes(tmp_path: Path) -> None:
    dirpath, marker = tmp_path / "ckpts", tmp_path / "pwned"
    _train(dirpath, tmp_path, 10)
    _replace_newest(dirpath, {"hyper_parameters": {"payload": RunsCode(marker)}})
    with pytest.raises(UntrustedCheckpointError) as info:
        _train(dirpath, tmp_path, 15)
    assert not marker.exists()
    message = str(info.value)
    assert "posix.system" in message and "add_safe_globals([system])" in message and "allow_pickle=True" in message
    _train(dirpath, tmp_path, 15, allow_pickle=True)  # the opt-in unpickles fully, as before
    assert marker.exists()


def test_classes_the_user_allows_load_weights_only(tmp_path: Path) -> None:
    dirpath = tmp_path / "ckpts"
    _train(dirpath, tmp_path, 10)
    _replace_newest(dirpath, {"hyper_parameters": {"settings": Settings(8)}})
    with pytest.raises(UntrustedCheckpointError, match="test_lightning_trust.Settings"):
        _train(dirpath, tmp_path, 15)
    torch.serialization.add_safe_globals([Settings])
    try:
        auto = _train(dirpath, tmp_path, 15)
    finally:
        torch.serialization.clear_safe_globals()
    assert auto.resumed_from == 10
