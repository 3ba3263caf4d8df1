"""autockpt_torch/snapshot.py: copies into reusable buffers, and torch.save of the copies."""

from __future__ import annotations

import collections
import errno
import io
import zipfile
from typing import Any

import pytest
import torch

import autockpt_torch
from autockpt_torch import save_tree, snapshot_tree, torch_buffer_pool

torch.set_num_threads(1)


def take(state: Any, pool: Any) -> tuple[Any, int]:
    pool.begin_round()
    try:
        return snapshot_tree(state, pool)
    finally:
        pool.end_round()


def saved_bytes(tree: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(tree, buf)
    return buf.getvalue()


def loaded(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def make_state() -> dict[str, Any]:
    return {
        "state_dict": collections.OrderedDict(w=torch.randn(4, 3), b=torch.randn(3)),
        "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 3)}}, "lr": 0.1}],
        "hparams": {"hidden": 16, "names": ["a", "b"]},
        "epoch": 2,
    }


def test_public_api() -> None:
    assert set(autockpt_torch.__all__) >= {
        "ModeChoice", "PendingCopy", "TorchSnapshotter", "choose_mode", "cpu_default_mode",
        "save_tree", "snapshot_tree", "torch_buffer_pool",
    }
    public = {n for n in dir(autockpt_torch) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(autockpt_torch, n)).__name__ == "module"}
    assert set(autockpt_torch.__all__) == public - modules


def test_copy_is_independent_and_keeps_structure() -> None:
    pool = torch_buffer_pool()
    state = make_state()
    copy, nbytes = take(state, pool)
    assert nbytes == (12 + 3 + 1 + 12) * 4
    assert isinstance(copy["state_dict"], collections.OrderedDict)
    assert copy["hparams"] == state["hparams"] and copy["hparams"] is not state["hparams"]
    before = state["state_dict"]["w"].clone()
    state["state_dict"]["w"].add_(1.0)
    state["hparams"]["names"].append("c")
    assert torch.equal(copy["state_dict"]["w"], before)
    assert copy["hparams"]["names"] == ["a", "b"]


def test_buffers_are_reused_across_rounds_and_released_when_unused() -> None:
    pool = torch_buffer_pool()
    state = make_state()
    first, _ = take(state, pool)
    allocations = pool.allocations
    second, _ = take(state, pool)
    assert pool.allocations == allocations
    assert second["state_dict"]["w"].data_ptr() == first["state_dict"]["w"].data_ptr()
    del state["optimizer_states"]
    take(state, pool)
    assert len(pool) == 2 and pool.total_bytes == (12 + 3) * 4


def test_torch_save_of_reused_buffers_is_correct_per_round() -> None:
    """What the writer thread does: save round 1, then overwrite the same buffers in round 2."""
    pool = torch_buffer_pool()
    state = make_state()
    copy1, _ = take(state, pool)
    file1 = saved_bytes(copy1)
    expected1 = state["state_dict"]["w"].clone()
    state["state_dict"]["w"].mul_(-1)
    copy2, _ = take(state, pool)  # same buffers, new values
    file2 = saved_bytes(copy2)
    assert torch.equal(loaded(file1)["state_dict"]["w"], expected1)
    assert torch.equal(loaded(file2)["state_dict"]["w"], state["state_dict"]["w"])
    assert loaded(file2)["optimizer_states"][0]["state"][0]["step"].item() == 3.0


def test_torch_save_of_views_of_one_buffer() -> None:
    """Views sharing one buffer are saved once (whole storage) and load back as equal views."""
    buffer = torch.arange(10, dtype=torch.float32)
    tree = {"a": buffer[:3], "b": buffer[3:7].view(2, 2), "c": buffer[1::2]}
    back = loaded(saved_bytes(tree))
    for key in tree:
        assert torch.equal(back[key], tree[key]), key
    assert back["a"].untyped_storage().data_ptr() == back["b"].untyped_storage().data_ptr()


def test_non_contiguous_zero_dim_and_colliding_paths() -> None:
    pool = torch_buffer_pool()
    base = torch.randn(3, 5)
    state = {"t": base.t(), "s": torch.tensor(7), "a/b": torch.ones(2), "a": {"b": torch.zeros(2)}}
    copy, _ = take(state, pool)
    assert copy["t"].is_contiguous() and torch.equal(copy["t"], base.t())
    assert copy["s"].item() == 7 and copy["s"].dim() == 0
    assert torch.equal(copy["a/b"], torch.ones(2)) and torch.equal(copy["a"]["b"], torch.zeros(2))


def test_sparse_tensor_falls_back_to_a_fresh_copy() -> None:
    sparse = torch.eye(3).to_sparse()
    copy, nbytes = take({"s": sparse}, torch_buffer_pool())
    assert copy["s"].is_sparse and torch.equal(copy["s"].to_dense(), torch.eye(3))
    assert nbytes > 0


class _FullDisk(io.RawIOBase):
    def __init__(self, room: int) -> None:
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        if n > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= n
        return n


def test_save_tree_round_trips_and_surfaces_the_write_error() -> None:
    tree, _ = take(make_state(), torch_buffer_pool())
    out = io.BytesIO()
    save_tree(tree, out)
    assert torch.equal(loaded(out.getvalue())["state_dict"]["w"], tree["state_dict"]["w"])
    with pytest.raises(OSError, match="No space left"):  # not torch's "unexpected pos" follow-up
        save_tree(tree, _FullDisk(room=600))


def test_copies_run_with_the_requested_threads_and_restore_the_setting() -> None:
    seen: list[int] = []
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        state = {"a": torch.ones(3)}
        pool = torch_buffer_pool()
        real_get = pool.get

        def get(*args: Any) -> torch.Tensor:
            seen.append(torch.get_num_threads())
            return real_get(*args)

        pool.get = get  # type: ignore[method-assign]
        take(state, pool)
        assert seen == [1] and torch.get_num_threads() == 2
        pool.begin_round()
        snapshot_tree(state, pool, threads=None)
        assert seen == [1, 2]
    finally:
        torch.set_num_threads(previous)


def test_save_tree_without_zip_crc_loads_and_skips_only_the_zip_crc() -> None:
    if not hasattr(torch.serialization, "_get_storage_alignment"):  # pragma: no cover - torch 2.6
        pytest.skip("this torch has no CRC-less zip writer: save_tree writes the CRC")
    tree = {"a": torch.randn(1000), "b": [1, {"c": torch.arange(5)}]}
    plain, fast = io.BytesIO(), io.BytesIO()
    save_tree(tree, plain)
    save_tree(tree, fast, zip_crc32=False)
    assert len(plain.getvalue()) == len(fast.getvalue())
    back = torch.load(io.BytesIO(fast.getvalue()), weights_only=True)
    assert torch.equal(back["a"], tree["a"]) and torch.equal(back["b"][1]["c"], tree["b"][1]["c"])
    assert zipfile.ZipFile(io.BytesIO(plain.getvalue())).testzip() is None
    assert zipfile.ZipFile(io.BytesIO(fast.getvalue())).testzip() is not None  # the zip CRC was not computed


def test_save_tree_falls_back_to_torch_save_when_the_private_api_differs(monkeypatch) -> None:
    real = torch._C.PyTorchFileWriter

    def writer(*args: Any) -> Any:
        if args[1] is False:  # as if a later torch had another constructor
            raise TypeError("unexpected arguments")
        return real(*args)

    monkeypatch.setattr(torch._C, "PyTorchFileWriter", writer)
    out = io.BytesIO()
    save_tree({"a": torch.ones(3)}, out, zip_crc32=False)
    assert zipfile.ZipFile(io.BytesIO(out.getvalue())).testzip() is None
