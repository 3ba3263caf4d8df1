"""autockpt_torch/modes.py: which copy mode is chosen, for which state and machine; and the
snapshotter's "auto" trial, fed measured costs."""

from __future__ import annotations

import logging

import pytest
import torch

from autockpt_core.policy.checkpoint_cost import CheckpointCost
from autockpt_torch import TorchSnapshotter, auto_candidates, choose_mode, torch_buffer_pool

torch.set_num_threads(1)
MiB = 2**20


@pytest.mark.parametrize(
    ("requested", "on_cuda", "free", "mode"),
    [
        ("auto", False, None, "sync"),
        ("auto", True, 1000 * MiB, "device"),  # 100 MiB reserved of 1000 free
        ("auto", True, 150 * MiB, "overlap"),  # would take over half of what is free
        ("auto", True, None, "overlap"),
        ("sync", True, 1000 * MiB, "sync"),
        ("overlap", False, None, "overlap"),
        ("device", False, None, "overlap"),
        ("device", True, 50 * MiB, "overlap"),
        ("device", True, 150 * MiB, "device"),
    ],
)
def test_choose_mode(requested: str, on_cuda: bool, free: int | None, mode: str) -> None:
    choice = choose_mode(requested, on_cuda=on_cuda, deferrable_bytes=100 * MiB, free_device_bytes=free)
    assert choice.mode == mode and choice.reason


def test_choose_mode_uses_the_measured_cpu_default_and_rejects_unknown_modes() -> None:
    assert choose_mode("auto", on_cuda=False, deferrable_bytes=1, free_device_bytes=None, cpu_auto="overlap").mode == "overlap"
    with pytest.raises(ValueError, match="unknown snapshot mode"):
        choose_mode("fast", on_cuda=False, deferrable_bytes=1, free_device_bytes=None)
    with pytest.raises(ValueError, match="unknown snapshot mode"):
        TorchSnapshotter("fast")


# -- CPU: sync and overlap ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("guess", "on_cuda", "candidates"),
    [
        ("sync", False, ("sync", "overlap")),
        ("overlap", False, ("overlap", "sync")),
        ("overlap", True, ("overlap", "sync")),  # a GPU-side snapshot does not fit
        ("device", True, ("device", "sync", "overlap")),
    ],
)
def test_auto_tries_the_modes_that_fit_first_guess_first(guess: str, on_cuda: bool, candidates: tuple[str, ...]) -> None:
    assert auto_candidates(guess, on_cuda=on_cuda) == candidates


def test_auto_snapshotter_takes_the_trials_modes_in_turn_then_keeps_the_cheapest(caplog: pytest.LogCaptureFixture) -> None:
    state = {"w": torch.randn(8, 8), "step": 3}
    w = state["w"]
    snapshotter = TorchSnapshotter("auto", cpu_auto="overlap")
    pool = torch_buffer_pool()
    costs = {"overlap": 0.010, "sync": 0.050}
    used = []
    with caplog.at_level(logging.INFO, logger="autockpt"):
        for _ in range(6):
            pool.begin_round()
            _copy, nbytes, pending = snapshotter.snapshot(state, pool, lambda t: t.data_ptr() == w.data_ptr())
            pool.end_round()
            mode = snapshotter.mode
            assert mode is not None
            used.append(mode)
            assert (pending is not None) == (mode == "overlap")  # each checkpoint really uses its mode
            if pending is not None:
                pending.wait()
            snapshotter.record_cost(CheckpointCost(mode, costs[mode], 0.0, 1, 0.1, nbytes))
    assert used == ["overlap", "sync", "overlap", "sync", "overlap", "overlap"]
    assert snapshotter.choice is not None and snapshotter.choice.mode == "overlap"
    assert "lowest measured cost" in snapshotter.choice.reason
    assert any("snapshot copy mode overlap" in r.getMessage() and "sync blocks 50.0 ms" in r.getMessage() for r in caplog.records)


def test_a_requested_mode_is_never_replaced_by_measurements() -> None:
    snapshotter = TorchSnapshotter("overlap")
    pool = torch_buffer_pool()
    for _ in range(5):
        pool.begin_round()
        snapshotter.snapshot({"w": torch.ones(3)}, pool)
        pool.end_round()
        snapshotter.record_cost(CheckpointCost("overlap", 9.0, 0.0, 1, 0.1, 12))
    assert snapshotter.trial is None and snapshotter.mode == "overlap"
