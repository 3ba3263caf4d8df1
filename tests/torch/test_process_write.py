"""torch.save through the persist process: the pickle made in the training process."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from autockpt_core.persist.shared_memory import INLINE_LIMIT, SharedArena, SharedRef, rebuild_tree, shared_memory_supported
from autockpt_torch import torch_shared_pool
from autockpt_torch.process_write import STORAGE_VIEW, portable_tree_write, record_tree, storage_view, write_records

needs_shm = pytest.mark.skipif(not shared_memory_supported(), reason="needs os.memfd_create (Linux)")
ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Point:
    x: int


def _shared_tree(arena: SharedArena) -> dict[str, object]:
    pool = torch_shared_pool(arena)
    pool.begin_round()
    w = pool.get("w", (3, 4), torch.float32)
    b = pool.get("b", (4,), torch.bfloat16)
    pool.end_round()
    w.copy_(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    b.fill_(2.5)
    return {"state_dict": {"w": w, "b": b, "w_view": w[1]}, "step": 7, "hp": Point(3), "small": torch.ones(2)}


@needs_shm
@pytest.mark.parametrize("zip_crc32", [True, False])
def test_replayed_records_are_the_file_torch_save_writes(zip_crc32: bool) -> None:
    arena = SharedArena()
    tree = _shared_tree(arena)
    records = record_tree(tree, arena)
    assert records is not None
    refs = [data for _name, data, _n in records if isinstance(data, SharedRef)]
    assert len(refs) == 2 and {r.kind for r in refs} == {STORAGE_VIEW}  # w (with its view) and b; "small" by value
    memories = {sid: arena._segments[sid].memory for sid in arena.live_segments()}
    rebuilt = rebuild_tree(records, lambda ref: storage_view(memories[ref.segment], ref.offset, ref.dtype, ref.shape))
    ours = io.BytesIO()
    write_records(ours, records=rebuilt, zip_crc32=zip_crc32)
    theirs = io.BytesIO()
    torch.save(tree, theirs)
    with zipfile.ZipFile(io.BytesIO(ours.getvalue())) as a, zipfile.ZipFile(io.BytesIO(theirs.getvalue())) as b:
        names = [n for n in a.namelist() if not n.endswith("serialization_id")]
        assert names == [n for n in b.namelist() if not n.endswith("serialization_id")]
        assert all(a.read(n) == b.read(n) for n in names if zip_crc32)  # byte for byte, record by record
    loaded = torch.load(io.BytesIO(ours.getvalue()), weights_only=False)
    assert loaded["hp"] == Point(3) and loaded["step"] == 7
    assert torch.equal(loaded["state_dict"]["w"], tree["state_dict"]["w"])  # type: ignore[index]
    assert torch.equal(loaded["state_dict"]["b"], torch.full((4,), 2.5, dtype=torch.bfloat16))
    assert loaded["state_dict"]["w_view"].untyped_storage().data_ptr() == loaded["state_dict"]["w"].untyped_storage().data_ptr()
    arena.close()


@needs_shm
def test_records_refuse_large_storages_outside_the_shared_buffers() -> None:
    arena = SharedArena()
    big = torch.zeros(INLINE_LIMIT // 4 + 1)  # ordinary memory, over the limit
    assert record_tree({"big": big}, arena) is None
    assert portable_tree_write({"big": big}).for_process_of(arena) is None  # the writer thread writes it
    assert record_tree({"small": big[:10].clone()}, arena) is not None


SCRIPT = textwrap.dedent(
    """
    import dataclasses, enum, sys, warnings
    import torch
    from autockpt_core.persist import LocalStorage, read_manifest
    from autockpt_core.persist.persist_process import PersistProcess
    from autockpt_core.persist.shared_memory import SharedArena
    from autockpt_core.persist.writer import CheckpointWriter, PersistJob
    from autockpt_torch import torch_shared_pool
    from autockpt_torch.process_write import portable_tree_write

    class Color(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class HParams:  # defined in __main__: the persist process has no such class
        width: int
        color: Color

    warnings.simplefilter("error")  # the process must not fail a write
    arena = SharedArena()
    pool = torch_shared_pool(arena)
    process = PersistProcess(arena, ("autockpt_torch.process_write",))
    storage = LocalStorage(sys.argv[1])
    writer = CheckpointWriter(storage, keep_last=3, process=process)
    assert process.wait_ready(60)
    for step in (1, 2):
        pool.begin_round()
        w = pool.get("w", (1000,), torch.float32)
        pool.end_round()
        w.fill_(step)
        portable = portable_tree_write({"w": w, "hp": HParams(8, Color.RED), "step": step})
        writer.submit(PersistJob(f"ckpt-{step}.ckpt", step, 0, "test", write=portable.run, portable=portable))
        writer.wait()
    assert process.writes == 2, process.writes
    saved = torch.load(storage.local_path("ckpt-2.ckpt"), weights_only=False)
    assert saved["hp"] == HParams(8, Color.RED) and float(saved["w"][0]) == 2.0
    assert [r.step for r in read_manifest(storage)] == [1, 2]
    process.close()
    print("ok")
    """
)


@needs_shm
def test_a_class_of_the_training_scripts_main_is_written_by_the_persist_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
