"""Capture and restore every global generator a torch training process draws from.

Extends :mod:`autockpt_core.rng` (Python ``random`` and numpy's global generator) with torch's
CPU generator and, when CUDA is initialized, the generator of every visible CUDA device.
The result is plain JSON (byte states as base64 strings), one state per process (per rank).

Call order and threading: ``capture_rng()`` on the training thread when the snapshot is taken;
``restore_rng(state)`` on the training thread at the matching point of the resumed run (the
Lightning callback does it in ``on_train_start``). CUDA states are captured only when CUDA is
already initialized (capturing would otherwise initialize it); on restore they are set when
the state holds one per visible device, and otherwise reported in the returned list of
problems (e.g. a different number of GPUs), so the caller can warn that the resume is not
bitwise exact.
"""

from __future__ import annotations

import base64
from typing import Any

import torch

from autockpt_core import rng as core_rng

__all__ = ["capture_rng", "restore_rng"]


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.cpu().numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch CPU and (if initialized) CUDA generator states, as plain JSON."""
    state = core_rng.capture_rng()
    state["torch"] = _encode(torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_encode(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> list[str]:
    """Restore a state from :func:`capture_rng`; returns what could not be restored (empty: all)."""
    core_rng.restore_rng(state)
    problems: list[str] = []
    if "torch" in state:
        torch.set_rng_state(_decode(state["torch"]))
    else:
        problems.append("the checkpoint holds no torch CPU generator state")
    cuda = state.get("cuda")
    if cuda is not None:
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible == len(cuda):
            torch.cuda.set_rng_state_all([_decode(s) for s in cuda])
        else:
            problems.append(
                f"the checkpoint holds CUDA generator states for {len(cuda)} device(s), this process sees {visible}"
            )
    return problems
