"""autockpt_torch/modes.py: which copy mode is chosen, for which state and machine."""

from __future__ import annotations

import pytest
import torch

from autockpt_torch import TorchSnapshotter, choose_mode

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
