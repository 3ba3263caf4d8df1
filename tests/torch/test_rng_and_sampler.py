"""autockpt_torch.rng (torch + CUDA generators) and ResumableSampler."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from autockpt_torch import ResumableSampler, capture_rng, restore_rng

torch.set_num_threads(1)


def test_torch_rng_round_trip_covers_python_numpy_and_torch() -> None:
    torch.manual_seed(5)
    state = json.loads(json.dumps(capture_rng()))
    first = (torch.rand(4), torch.nn.functional.dropout(torch.ones(8), 0.5), random.random(), np.random.rand())
    torch.manual_seed(6)
    assert restore_rng(state) == []
    second = (torch.rand(4), torch.nn.functional.dropout(torch.ones(8), 0.5), random.random(), np.random.rand())
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1]) and first[2:] == second[2:]


def test_missing_or_mismatched_device_states_are_reported_not_raised() -> None:
    state = capture_rng()
    assert "cuda" not in state or torch.cuda.is_initialized()
    assert restore_rng({k: v for k, v in state.items() if k != "torch"}) == [
        "the checkpoint holds no torch CPU generator state"
    ]
    problems = restore_rng({**state, "cuda": ["AAAA"] * 9})
    assert len(problems) == 1 and "9 device(s)" in problems[0]


def test_order_depends_on_seed_and_epoch_only() -> None:
    a, b = ResumableSampler(50, seed=1), ResumableSampler(range(50), seed=1)
    torch.manual_seed(0)
    first = list(a)
    torch.manual_seed(1)  # the global generator plays no part
    assert list(b) == first and sorted(first) == list(range(50))
    b.set_epoch(1)
    assert list(b) != first and list(ResumableSampler(50, seed=2)) != first
    assert list(ResumableSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


def test_resume_mid_epoch_yields_exactly_the_rest() -> None:
    full = ResumableSampler(40, seed=3)
    full.set_epoch(2)
    order = list(full)
    state = full.state_dict(consumed=24)
    assert (state["epoch"], state["consumed"]) == (2, 24)
    resumed = ResumableSampler(40, seed=3)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    resumed.set_epoch(2)  # what the loop does before the epoch
    assert list(resumed) == order[24:]
    resumed.set_epoch(3)
    assert len(list(resumed)) == 40  # the next epoch is whole again


def test_finished_epoch_resumes_at_the_next_one() -> None:
    sampler = ResumableSampler(10, seed=0)
    list(sampler)
    state = sampler.state_dict()  # no count given: the indices it handed out (all 10)
    resumed = ResumableSampler(10, seed=0)
    resumed.load_state_dict(state)
    reference = ResumableSampler(10, seed=0)
    reference.set_epoch(1)
    assert resumed.epoch == 1 and list(resumed) == list(reference)


def test_without_set_epoch_each_iteration_is_the_next_epoch() -> None:
    sampler = ResumableSampler(20, seed=4)
    epochs = [list(sampler) for _ in range(3)]
    expected = [ResumableSampler(20, seed=4).order(e) for e in range(3)]
    assert epochs == expected and sampler.epoch == 2


def test_state_of_another_dataset_is_refused() -> None:
    state = ResumableSampler(10, seed=0).state_dict()
    with pytest.raises(ValueError, match="size: saved 10, now 11"):
        ResumableSampler(11, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        ResumableSampler(10, seed=1).load_state_dict(state)


def test_in_a_dataloader_with_workers_the_caller_counts_consumed_samples() -> None:
    data = TensorDataset(torch.arange(32))
    sampler = ResumableSampler(data, seed=9)
    loader = DataLoader(data, batch_size=4, sampler=sampler, num_workers=1, prefetch_factor=2)
    it = iter(loader)
    seen = [next(it)[0] for _ in range(3)]
    state = sampler.state_dict(consumed=3 * 4)  # the workers pulled more indices than that
    assert sampler.position > 12 and state["consumed"] == 12
    del it
    resumed = ResumableSampler(data, seed=9)
    resumed.load_state_dict(state)
    rest = [b[0] for b in DataLoader(data, batch_size=4, sampler=resumed)]
    assert torch.equal(torch.cat(seen + rest), torch.tensor(sampler.order(0)))
