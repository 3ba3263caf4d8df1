"""The CUDA queue probe outside CUDA (tests/gpu runs it on a GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from autockpt_torch.cuda_api import queue_busy_probe  # noqa: E402


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu"), "meta"])
def test_no_probe_for_a_device_without_a_queue(device: object) -> None:
    assert queue_busy_probe(device) is None  # type: ignore[arg-type]


def test_no_probe_for_cuda_where_cuda_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert queue_busy_probe("cuda:0") is None


def test_the_probe_asks_the_devices_current_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stream:
        pending = True

        def query(self) -> bool:  # CUDA: True once every queued kernel has finished
            return not self.pending

    stream = Stream()
    asked: list[object] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: asked.append(device) or stream)
    busy = queue_busy_probe("cuda:1")
    assert busy is not None and busy() is True
    stream.pending = False
    assert busy() is False
    assert asked == [torch.device("cuda", 1)] * 2
