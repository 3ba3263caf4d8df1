"""The run's ledger: what checkpoints cost the training and how many were taken, and the
numbers reported from it (the framework's logger, the events, the end-of-run summary line).

``CheckpointSession`` writes to it on the training thread (``started`` at ``start()``,
``step`` after every optimizer step, ``hooks`` for its hook's own time, ``stalled`` for every
blocked interval, ``taken`` per checkpoint) and reads it in ``metrics()`` and ``summary()``.
``others`` times the framework's own checkpoint saves beside autockpt's (the adapters watch
their methods, :mod:`.other_checkpoints`); ``summary()`` reports them and puts the methods back.
The overhead it reports is the measured one (:mod:`.policy.overhead_meter`): the wall time
of the steps with checkpoint work against clean steps, with its noise; never the blocked time
alone.
"""

from __future__ import annotations

from .config import Config
from .other_checkpoints import OtherCheckpoints
from .persist import BufferPool
from .policy import Estimates
from .policy.decision import IntervalChoice as Interval
from .policy.overhead_meter import Overhead, OverheadMeter
from .summary import RunSummary


class RunLedger:
    """Counters of one session; ``warmup_steps``: steps the overhead does not count."""

    def __init__(self, warmup_steps: int = 0) -> None:
        self.meter = OverheadMeter(warmup_steps)
        self.start_time: float | None = None
        self.total_stall = 0.0
        self.checkpoints = 0
        self.newest_step: int | None = None
        self.newest_name: str | None = None
        self.copy_mode: str | None = None
        self.others = OtherCheckpoints()

    def started(self, now: float) -> None:
        self.start_time = now

    def step(self, seconds: float, loaded: bool) -> None:
        """One optimizer step's duration (its blocked time subtracted); ``loaded``: it
        overlapped a snapshot copy or a persist."""
        self.meter.step(seconds, loaded)

    def revise_last_step(self, seconds: float) -> None:
        """The job's duration of the newest step (the slowest rank's) replaces it."""
        self.meter.revise_last_step(seconds)

    def stalled(self, seconds: float) -> None:
        """The training thread was blocked ``seconds`` by a checkpoint (hook, copy, wait)."""
        self.total_stall += seconds
        self.meter.blocked(seconds)

    def hooks(self, seconds: float) -> None:
        """autockpt's own work in the hook of the step just recorded took ``seconds``."""
        self.meter.hooks(seconds)

    def waited_at_end(self, seconds: float) -> None:
        """The end of training waited ``seconds`` for the last persist: an overhead the run
        pays, not a checkpoint's stall."""
        self.meter.blocked(seconds)

    def taken(self, step: int, name: str, mode: str | None) -> None:
        """A checkpoint of ``step`` was handed to the writer as ``name`` (copied in ``mode``)."""
        self.checkpoints += 1
        self.newest_step, self.newest_name = step, name
        self.copy_mode = mode or self.copy_mode

    def overhead(self) -> Overhead:
        """The measured overhead so far, with its noise."""
        return self.meter.reading()

    def metrics(
        self, est: Estimates, interval: Interval | None, buffers: BufferPool[object], released_bytes: int
    ) -> dict[str, float]:
        """Numbers for the framework's logger: interval, stall, overhead, checkpoint count."""
        out: dict[str, float] = {"autockpt/checkpoints": float(self.checkpoints)}
        if interval is not None:
            out["autockpt/interval_steps"] = float(interval.steps)
        if est.stall_s is not None:
            out["autockpt/stall_ms"] = est.stall_s * 1e3
        overhead = self.overhead()
        if overhead.value is not None and overhead.band is not None:
            out["autockpt/overhead_pct"] = overhead.value * 100.0
            out["autockpt/overhead_band_pct"] = overhead.band * 100.0
        if overhead.hooks is not None:
            out["autockpt/hook_pct"] = overhead.hooks * 100.0
        if overhead.left_out:
            out["autockpt/left_out_steps"] = float(overhead.left_out)
        if buffers.peak_bytes:
            out["autockpt/buffer_bytes"] = float(buffers.total_bytes or released_bytes)
            out["autockpt/buffer_peak_bytes"] = float(buffers.peak_bytes)
        return out

    def summary(
        self,
        framework: str,
        config: Config,
        est: Estimates,
        interval: Interval | None,
        deferred: int,
        buffers: BufferPool[object],
        released_bytes: int,
        newest_path: str | None,
        mirror: str | None,
        mirrored: int,
        clock_note: str | None = None,
    ) -> RunSummary:
        overhead = self.overhead()
        self.others.release()  # the fit is over: the framework's methods are its own again
        return RunSummary(
            framework=framework,
            checkpoints=self.checkpoints,
            mean_stall_s=(self.total_stall / self.checkpoints) if self.checkpoints else None,
            checkpoint_bytes=est.checkpoint_bytes,
            overhead=overhead.value,
            overhead_band=overhead.band,
            left_out_steps=overhead.left_out,
            left_out_s=overhead.left_out_s,
            hooks=overhead.hooks,
            hook_us=est.hook_s * 1e6 if est.hook_s is not None else None,
            budget=config.overhead_budget,
            interval_steps=interval.steps if interval is not None else None,
            interval_rule=interval.rule if interval is not None else None,
            newest_step=self.newest_step,
            newest_path=newest_path,
            persist_s=est.persist_s,
            deferred=deferred,
            buffer_bytes=buffers.total_bytes or released_bytes,
            buffer_peak_bytes=buffers.peak_bytes,
            copy_mode=self.copy_mode,
            mirror=mirror,
            mirrored=mirrored,
            clock_note=clock_note,
            mtbf_s=config.mtbf,
            other_saves=self.others.saves,
            other_save_s=self.others.save_s,
            other_what=self.others.what,
        )
