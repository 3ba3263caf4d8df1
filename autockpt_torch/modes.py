"""Which snapshot copy modes to use (``Config.snapshot_mode``): pure choices.

The modes themselves ("sync", "overlap", "device") are described in
:mod:`autockpt_torch.staging`; :class:`~autockpt_torch.staging.TorchSnapshotter` calls
:func:`choose_mode` at its first snapshot; for ``"auto"`` that is the first guess, and
:func:`auto_candidates` the modes then tried and measured.
"""

from __future__ import annotations

import dataclasses


def cpu_default_mode(threads: int, cores: int | None) -> str:
    """``"auto"``'s first guess on CPU (tried first, then measured against the other mode):
    ``"overlap"`` when training leaves a core for the copy thread (torch's intra-op
    ``threads`` < ``cores``), else ``"sync"``.

    Measured with ``autockpt bench`` on the project's shared 2-core machines
    (docs/benchmarks.md): with 1 training thread, overlapping halved the blocked time at
    100 MB (16.9 vs 36.1 ms) at equal training slowdown; with 2 training threads the helper
    thread competed with them and steps got slower (median of 3 pairs: 501 vs 340 ms).
    """
    return "overlap" if cores is not None and threads < cores else "sync"

DEVICE_FRACTION = 0.5
"""``"auto"`` reserves GPU buffers only when they take at most this share of free GPU memory."""

MODES = ("auto", "sync", "overlap", "device")


def auto_candidates(guess: str, *, on_cuda: bool) -> tuple[str, ...]:
    """The modes ``"auto"`` tries (:class:`~autockpt_core.policy.mode_trial.ModeTrial`), the
    first ``guess`` (:func:`choose_mode`) first: "sync" and "overlap", and on CUDA "device"
    when the guess says it fits in free GPU memory."""
    modes = ["sync", "overlap"] + (["device"] if on_cuda and guess == "device" else [])
    return (guess, *(m for m in modes if m != guess))


@dataclasses.dataclass(frozen=True)
class ModeChoice:
    """The copy mode in use and why it was chosen (logged once)."""

    mode: str
    reason: str


def choose_mode(
    requested: str,
    *,
    on_cuda: bool,
    deferrable_bytes: int,
    free_device_bytes: int | None,
    cpu_auto: str = "sync",
    device_fraction: float = DEVICE_FRACTION,
) -> ModeChoice:
    """The mode to use for a state (pure; see the module docstring for the modes).

    ``on_cuda``: some tensor of the state lives on a CUDA device. ``deferrable_bytes``: the
    bytes a GPU-side snapshot would reserve. ``free_device_bytes``: free memory of that
    device (None if unknown). ``cpu_auto``: the CPU choice (see :func:`cpu_default_mode`).
    """
    if requested not in MODES:
        raise ValueError(f"unknown snapshot mode {requested!r}; use one of {', '.join(MODES)}")
    if requested == "sync":
        return ModeChoice("sync", "requested")
    fits = free_device_bytes is not None and deferrable_bytes <= device_fraction * free_device_bytes
    room = (
        f"{deferrable_bytes / 2**20:.0f} MiB of {free_device_bytes / 2**20:.0f} MiB free"
        if free_device_bytes is not None
        else "free GPU memory unknown"
    )
    if requested == "overlap":
        return ModeChoice("overlap", "requested")
    if requested == "device":
        if not on_cuda:
            return ModeChoice("overlap", "device snapshot requested, but no tensor is on a GPU")
        if free_device_bytes is not None and deferrable_bytes > free_device_bytes:
            return ModeChoice("overlap", f"device snapshot requested, but it does not fit ({room})")
        return ModeChoice("device", "requested")
    if not on_cuda:  # auto, CPU
        return ModeChoice(cpu_auto, "auto: CPU state (cpu_default_mode, docs/benchmarks.md)")
    if fits:
        return ModeChoice("device", f"auto: GPU-side snapshot fits ({room})")
    return ModeChoice("overlap", f"auto: GPU-side snapshot too large ({room}); copying to host on a stream")
