"""Canaries for every private torch name the torch code reads (``autockpt_torch.internals``),
and what a torch that renamed one would do.

Run against a new torch before listing it as tested: ``python -m pytest tests/compat``.

1. Each name exists on the installed torch with the shape the writes expect.
2. Each name renamed (simulated: the door looks for another attribute name) gives one named
   log warning at the fit's start and checkpoints that are still written and load equal,
   by the writer thread instead of the persist process, or with the zip CRCs; never an
   ``AttributeError``.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from autockpt_core.persist.shared_memory import SharedArena, shared_memory_supported
from autockpt_torch import internals, save_tree, torch_shared_pool
from autockpt_torch.process_write import portable_tree_write

needs_shm = pytest.mark.skipif(not shared_memory_supported(), reason="needs os.memfd_create (Linux)")


class Records:
    def __init__(self) -> None:
        self.names: list[str] = []

    def write_record(self, name: str, data: object, nbytes: int) -> None:
        self.names.append(name)


def test_every_name_is_there_with_the_shape_the_writes_expect() -> None:
    assert internals.missing() == []
    records = Records()
    internals.serialization_into()({"w": torch.ones(2)}, records, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    assert any(name.endswith("data.pkl") for name in records.names) and "data/0" in records.names
    out = io.BytesIO()
    with internals.zipfile_writer()(out) as writer:
        writer.write_record("data.pkl", b"x", 1)
    assert "archive/data.pkl" in zipfile.ZipFile(io.BytesIO(out.getvalue())).namelist()
    plain = io.BytesIO()
    crc_less = internals.writer_without_crc(plain)
    assert crc_less is not None
    crc_less.write_record("data.pkl", b"x", 1)
    crc_less.write_end_of_file()
    assert zipfile.ZipFile(io.BytesIO(plain.getvalue())).testzip() == "archive/data.pkl"  # no CRC computed


def renamed(monkeypatch: pytest.MonkeyPatch, key: str) -> str:
    entry = internals.INTERNALS[key]
    monkeypatch.setitem(internals.INTERNALS, key, dataclasses.replace(entry, attr=f"{entry.attr}_renamed_by_a_release"))
    return entry.label


@pytest.mark.parametrize("key", sorted(internals.INTERNALS))
def test_a_renamed_name_is_named_once_and_checkpoints_still_load(
    key: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    label = renamed(monkeypatch, key)
    with caplog.at_level(logging.WARNING, logger="autockpt"):
        internals.check_internals()
    assert [r.getMessage() for r in caplog.records if label in r.getMessage()] != []
    assert internals.missing() == [internals.INTERNALS[key]]
    tree = {"w": torch.randn(100), "nested": [7, {"b": torch.arange(4)}]}
    for zip_crc32 in (True, False):
        out = io.BytesIO()
        save_tree(tree, out, zip_crc32=zip_crc32)
        back = torch.load(io.BytesIO(out.getvalue()), weights_only=True)
        assert torch.equal(back["w"], tree["w"]) and torch.equal(back["nested"][1]["b"], tree["nested"][1]["b"])
        if key in ("storage_alignment", "file_writer"):
            assert zipfile.ZipFile(io.BytesIO(out.getvalue())).testzip() is None  # the CRCs were written


@needs_shm
@pytest.mark.parametrize("key", ["save", "open_zipfile_writer"])
def test_without_the_replay_names_the_writer_thread_writes(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    arena = SharedArena()
    pool = torch_shared_pool(arena)
    pool.begin_round()
    w = pool.get("w", (8,), torch.float32)
    pool.end_round()
    assert portable_tree_write({"w": w}).for_process_of(arena) is not None
    renamed(monkeypatch, key)
    assert portable_tree_write({"w": w}).for_process_of(arena) is None
    arena.close()


@needs_shm
def test_a_fit_on_a_torch_without_any_of_them_trains_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from autockpt_lightning import AutoCheckpoint
    from tests.lightning.lightning_helpers import TinyData, TinyModel, make_trainer

    for key in internals.INTERNALS:
        renamed(monkeypatch, key)
    auto = AutoCheckpoint(tmp_path / "ckpts", every_n_steps=4, save_on_train_end=False)
    with caplog.at_level(logging.WARNING, logger="autockpt"):
        make_trainer(tmp_path, [auto], max_steps=9).fit(TinyModel(), TinyData())
    assert sum("torch.serialization._save" in r.getMessage() for r in caplog.records) == 1
    assert auto.session is not None and auto.session.process_writes == 0  # the writer thread wrote them
    assert [e.step for e in auto.events] == [4, 8]
    resumed = AutoCheckpoint(tmp_path / "ckpts", every_n_steps=4, save_on_train_end=False)
    make_trainer(tmp_path, [resumed], max_steps=10).fit(TinyModel(), TinyData())
    assert resumed.resumed_from == 8
