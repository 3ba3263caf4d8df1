"""The one-line end-of-training summary both adapters print."""

from __future__ import annotations

import dataclasses

from .policy.overhead_meter import overhead_text
from .units import format_duration, format_size


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What checkpointing did in one run; ``line()`` is what the callbacks print.

    ``overhead``: the measured fraction of training time checkpointing cost
    (:mod:`.policy.overhead_meter`), ``overhead_band``: the half-width of its ~95% band; a
    band wider than the budget is printed as such, not as a precise-looking number.
    ``left_out_steps``/``left_out_s``: steps over five clean steps long that the overhead left
    out as the machine's stalls (:mod:`.policy.giant_steps`), and their seconds. ``hooks``:
    autockpt's own per-step work as a fraction of the step time, reported beside the budget
    (which is the checkpoints'), and ``hook_us`` the same in microseconds per step.
    ``clock_note``: where the costs could only be read on the host's clock while an accelerator
    runs the steps (TensorFlow, JAX on a GPU), that, at the end of the line. ``mtbf_s``: the
    configured MTBF (None: the interval is the densest the budget allows, and the line says so).
    ``other_saves``/``other_save_s``: the framework's own checkpoint saves in the run beside
    autockpt's (``other_what`` names who made them, e.g. Lightning's ModelCheckpoint) and the
    training time they blocked.
    """

    framework: str
    checkpoints: int
    mean_stall_s: float | None
    checkpoint_bytes: int | None
    overhead: float | None
    budget: float
    interval_steps: int | None
    interval_rule: str | None
    newest_step: int | None
    newest_path: str | None
    persist_s: float | None = None
    deferred: int = 0
    buffer_bytes: int = 0
    buffer_peak_bytes: int = 0
    copy_mode: str | None = None
    mirror: str | None = None
    mirrored: int = 0
    overhead_band: float | None = None
    left_out_steps: int = 0
    left_out_s: float = 0.0
    hooks: float | None = None
    hook_us: float | None = None
    clock_note: str | None = None
    mtbf_s: float | None = None
    other_saves: int = 0
    other_save_s: float = 0.0
    other_what: str = ""

    def line(self) -> str:
        if self.checkpoints == 0:
            return "autockpt: no checkpoints taken (run shorter than warm-up and profiling)"
        stall = f"{self.mean_stall_s * 1e3:.1f}ms" if self.mean_stall_s is not None else "n/a"
        size = format_size(self.checkpoint_bytes) if self.checkpoint_bytes else "n/a"
        overhead = overhead_text(self.overhead, self.overhead_band, self.budget)
        persist = format_duration(self.persist_s) if self.persist_s is not None else "n/a"
        interval = (
            f"{self.interval_steps} steps ({self.interval_rule}{self._densest_note()})"
            if self.interval_steps is not None else "n/a"
        )
        copy = f" ({self.copy_mode} copy)" if self.copy_mode else ""
        buffers = f", host buffers {format_size(self.buffer_peak_bytes)}" if self.buffer_peak_bytes else ""
        mirrored = f", {self.mirrored} mirrored to {self.mirror}" if self.mirror else ""
        left_out = ""
        if self.left_out_steps:
            plural = "s" if self.left_out_steps > 1 else ""
            left_out = (f", {self.left_out_steps} stalled step{plural} ({format_duration(self.left_out_s)}) "
                        "left out as the machine's")
        return (
            f"autockpt: {self.checkpoints} checkpoints, mean stall {stall}{copy} for {size}, "
            f"persist {persist}, overhead {overhead}{left_out}{self._hooks_text()}, "
            f"interval {interval}{buffers}, newest step {self.newest_step} -> {self.newest_path}{mirrored}"
            + self._others_text()
            + (f"; {self.clock_note}" if self.clock_note else "")
        )

    def hooks_warning(self) -> str | None:
        """A warning when autockpt's own per-step work alone took over a tenth of the budget."""
        if self.hooks is None or self.hooks <= self.budget / 10:
            return None
        return (f"autockpt: its own per-step work took {self.hooks * 100:.2f}% of the step time "
                f"({self.hook_us:.0f}µs per step), over a tenth of the {self.budget * 100:.2f}% budget; "
                "the budget bounds the checkpoints alone (docs/policy.md, 'The budget is for checkpoints')")

    def _densest_note(self) -> str:
        """Without an MTBF the budget (or the persist time) sets the interval: the densest one the
        budget allows, which a user may want sparser."""
        rule = (self.interval_rule or "").rsplit(":", 1)[-1]
        if self.mtbf_s is not None or rule not in ("budget", "persist"):
            return ""
        return ", the densest the budget allows without an mtbf; min_interval or mtbf for fewer"

    def _others_text(self) -> str:
        if not self.other_saves:
            return ""
        plural = "s" if self.other_saves > 1 else ""
        return (f"; beside it, {self.other_what or 'the framework'} saved {self.other_saves} time{plural} "
                f"in {format_duration(self.other_save_s)}")

    def _hooks_text(self) -> str:
        if self.hooks is None or self.hook_us is None:
            return ""
        return f", hooks {self.hook_us:.0f}µs/step ({self.hooks * 100:.2f}% of a step)"

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)
