"""``ShardedWriter``: DCP's asynchronous save of one rank's shards, staged into buffers reused
between checkpoints. One process (a gloo group of 1) with an FSDP2 model; the two-rank case
runs in tests/fault/test_lightning_faults.py."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

from autockpt_core import CheckpointWriteError
from autockpt_core.persist.checksum import checksum_stream
from autockpt_torch.sharded import ShardedWriter, read_listings

OPTIONS = StateDictOptions(cpu_offload=True)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Any]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def sharded_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 16)).sum().backward()
    optimizer.step()
    return model, optimizer


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "state_dict": get_model_state_dict(model, options=OPTIONS),
        "optimizer_0": get_optimizer_state_dict(model, optimizer, options=OPTIONS),
    }


def loaded_weights(model: torch.nn.Module, path: Path) -> dict[str, torch.Tensor]:
    target = {"state_dict": get_model_state_dict(model, options=OPTIONS)}
    target = {"state_dict": {k: torch.zeros_like(v) for k, v in target["state_dict"].items()}}
    dcp.load(target, checkpoint_id=path)
    return {k: v.full_tensor().clone() for k, v in target["state_dict"].items()}


def test_the_save_holds_the_weights_of_the_step_even_when_they_change_after_staging(group: Any, tmp_path: Path) -> None:
    model, optimizer = sharded_model()
    writer = ShardedWriter(group)
    before = {k: v.full_tensor().clone() for k, v in get_model_state_dict(model).items()}
    writer.save(state_of(model, optimizer), tmp_path / "a")
    writer.wait_staged()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the next optimizer step, after the staging copy
    writer.close()
    saved = loaded_weights(model, tmp_path / "a")
    assert saved.keys() == before.keys()
    for name in before:
        assert torch.equal(saved[name], before[name]), name
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [".autockpt-files-rank0.json", ".metadata", "__0_0.distcp"]
    # this rank's listing: its file's size and CRC-32, as a fresh read of the file gives them
    with open(tmp_path / "a" / "__0_0.distcp", "rb") as f:
        digest, size = checksum_stream(f)
    assert read_listings(tmp_path / "a") == {"__0_0.distcp": [size, digest]}


def test_staging_buffers_are_reused_from_one_checkpoint_to_the_next(group: Any, tmp_path: Path) -> None:
    model, optimizer = sharded_model()
    writer = ShardedWriter(group)
    if not writer.reuses_buffers:  # pragma: no cover - older torch
        pytest.skip("this torch has no DefaultStager")
    buffers = []
    for i in range(3):
        writer.save(state_of(model, optimizer), tmp_path / f"c{i}")
        writer.wait_written()
        # torch's StateDictStager keeps one staging storage per source storage (private API,
        # read only here): the same storages at every save mean nothing was allocated again.
        cached = writer._stager.stager._state_dict_stager._cached_storage_mapping  # type: ignore[union-attr]
        buffers.append(sorted(s.data_ptr() for s in cached.values()))
        optimizer.step()
    writer.close()
    assert len(buffers[0]) >= 6 and buffers[0] == buffers[1] == buffers[2]


def test_a_failed_write_is_raised_by_the_next_wait_and_only_once(group: Any, tmp_path: Path) -> None:
    model, optimizer = sharded_model()
    writer = ShardedWriter(group)
    (tmp_path / "taken").write_bytes(b"a file where the directory should be")
    writer.save(state_of(model, optimizer), tmp_path / "taken")
    # DCP's CheckpointException is a BaseException: it comes out as an ordinary error naming the rank
    with pytest.raises(CheckpointWriteError, match=r"in .*taken was not written: rank 0: FileExistsError"):
        writer.wait_written()
    writer.wait_written()  # raised once
    writer.save(state_of(model, optimizer), tmp_path / "next")
    writer.close()
    assert (tmp_path / "next" / ".metadata").is_file()


def _closing_after_each_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11's ``DefaultStager._stage``, which closes its ``StateDictStager`` at the end of
    every stage (clearing its copier table and cached storages), on the installed torch."""
    DefaultStager = pytest.importorskip("torch.distributed.checkpoint.staging").__dict__.get("DefaultStager")
    if DefaultStager is None:  # pragma: no cover - older torch
        pytest.skip("this torch has no DefaultStager")

    from autockpt_torch import sharded

    original = DefaultStager._stage

    def stage_then_close(self: Any, state_dict: Any, **kwargs: Any) -> Any:
        staged = original(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return staged

    monkeypatch.setattr(DefaultStager, "_stage", stage_then_close)
    sharded.stager_survives_reuse.cache_clear()
    monkeypatch.setattr(sharded, "stager_survives_reuse", functools.lru_cache(sharded.stager_survives_reuse.__wrapped__))


def test_a_stager_that_cannot_stage_twice_is_not_reused(group: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Reused, that stager fails the second checkpoint with KeyError: <class 'type'> (torch 2.11).
    _closing_after_each_stage(monkeypatch)
    model, optimizer = sharded_model()
    with pytest.warns(RuntimeWarning, match=r"stage synchronously .* cannot stage a second time") as caught:
        writer = ShardedWriter(group)
    assert len(caught) == 1 and not writer.reuses_buffers
    expected = []
    for i in range(3):
        expected.append({k: v.full_tensor().clone() for k, v in get_model_state_dict(model).items()})
        writer.save(state_of(model, optimizer), tmp_path / f"c{i}")
        writer.wait_written()
        model(torch.randn(3, 16)).sum().backward()
        optimizer.step()
    writer.close()
    for i in range(3):
        saved = loaded_weights(model, tmp_path / f"c{i}")
        assert all(torch.equal(saved[k], expected[i][k]) for k in expected[i]), i
    assert not all(torch.equal(expected[0][k], expected[2][k]) for k in expected[0])


def test_a_staging_that_fails_is_staged_again_without_the_stager(group: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, optimizer = sharded_model()
    writer = ShardedWriter(group)
    if not writer.reuses_buffers:  # pragma: no cover - torch 2.11, older torch
        pytest.skip("this torch's DefaultStager is not used")
    from torch.distributed.checkpoint.staging import DefaultStager

    def fail(self: Any, state_dict: Any, **kwargs: Any) -> Any:
        raise KeyError(type)

    monkeypatch.setattr(DefaultStager, "_stage", fail)
    before = {k: v.full_tensor().clone() for k, v in get_model_state_dict(model).items()}
    writer.save(state_of(model, optimizer), tmp_path / "a")
    with pytest.warns(RuntimeWarning, match=r"DefaultStager failed to stage this checkpoint \(KeyError: <class 'type'>\)"):
        writer.wait_staged()
    assert not writer.reuses_buffers
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the next optimizer step: after the staging done again
    writer.wait_written()
    writer.save(state_of(model, optimizer), tmp_path / "b")  # no stager any more: no second warning
    writer.close()
    saved = loaded_weights(model, tmp_path / "a")
    assert all(torch.equal(saved[k], before[k]) for k in before)
    assert (tmp_path / "b" / ".metadata").is_file()
