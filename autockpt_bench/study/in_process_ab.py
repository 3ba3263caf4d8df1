"""What checkpointing every ``k`` steps costs, measured inside one process (an A/B in blocks).

Separate processes of one job differ by up to 8–13% in step time on a busy machine, more than a
2% budget; within one process, steps differ far less. So the study also runs autockpt at a fixed
interval ``k`` (the interval a budget run chose) in alternating blocks of ``block`` steps
(a multiple of ``k``) after the warm-up: checkpoints are taken in the *on* blocks and held back in
the *off* blocks, where autockpt's hooks still run (they are measured on their own, see
``hook_s_median``). Everything else is the same process, model, data and machine state.

A checkpoint's cost outlasts its block: its persist can still run in the next off block, and
whatever it leaves behind (page cache, caches evicted, memory) can slow the steps after it.
:func:`ab_figures` therefore splits each off block into a *spill* (the steps while a persist
still ran, then ``guard`` steps more) and a *reference* (the rest), and charges a cycle (an on
block and the next off block's spill) with its steps' excess over the reference::

    cost_i     = Σ t(on block i + spill i) − (n_on + n_spill) · ref_i
    overhead_i = cost_i / (n_on · ref_i)       (ref_i: the mean reference step of the off blocks
                                                 before and after on block i)

A step longer than :data:`OUTLIER_FACTOR` × the run's median step (a Keras epoch boundary on
this machine can stall 17–20 s, with or without checkpoints) would decide a whole block; such
steps are left out of both arms and listed (``ab_excluded``, each marked charged or not), so a
checkpoint that causes them shows as a list of charged ones.

``overhead`` is the mean of the per-cycle figures and ``noise`` their standard deviation over
√cycles: its standard error (the report pools cycles over repetitions the same way). ``meter_view`` is what autockpt's in-run meter sees in the same
on blocks: its loaded steps against its clean steps of the same blocks
(:mod:`autockpt_core.policy.overhead_meter`), so ``overhead − meter_view`` is the cost landing
in steps the meter takes as clean.

Call order (training thread): :class:`Alternation` ``attach(session)`` once the session exists,
then ``step_done(step)`` after every step; ``figures(durations)`` (:func:`ab_figures`) at the
end. Pure apart from the session it wraps: no clock, no threads.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Mapping
from typing import Any

__all__ = ["Alternation", "ab_block", "ab_figures"]

#: A step longer than this many median steps is left out of both arms (and listed).
OUTLIER_FACTOR = 5.0

#: Steps per block at least (a block is a whole number of intervals: one, or as many as reach this).
MIN_BLOCK = 12


def ab_block(every: int) -> int:
    """Steps per block for an interval of ``every`` steps: a multiple of it, so each on block
    holds the same number of checkpoints wherever it starts; one interval where that is at
    least :data:`MIN_BLOCK` steps (a run of ``c`` cycles trains ``2·c`` blocks, and a budget's
    interval can be hundreds of steps)."""
    if every < 1:
        raise ValueError(f"every: {every!r} is not a step count; give the interval in steps, ≥ 1")
    return every * math.ceil(MIN_BLOCK / every)


class Alternation:
    """On and off blocks of ``block`` steps after ``warmup`` steps (the warm-up is on).

    ``attach(session)`` wraps the session's ``decide`` so a checkpoint decided in an off block
    is not taken (the fixed interval's next multiple of ``k`` comes in the next on block), and
    its ledger so each step's *loaded* flag (the meter's view) is kept by global step.
    """

    def __init__(self, block: int, warmup: int) -> None:
        if block < 1:
            raise ValueError(f"block: {block!r} steps; give a block of at least 1 step")
        self.block, self.warmup = block, warmup
        self.loaded: dict[int, bool] = {}
        self.busy_after: dict[int, bool] = {}
        self._session: Any = None

    def is_on(self, step: int) -> bool:
        """Whether checkpoints are taken at global step ``step`` (1-based)."""
        return step <= self.warmup or ((step - self.warmup - 1) // self.block) % 2 == 0

    def attach(self, session: Any) -> None:
        """Wrap ``session.decide``, ``session.record_steps`` and ``session.ledger.step`` (training
        thread, before the first step after the warm-up)."""
        decide, record_steps, record = session.decide, session.record_steps, session.ledger.step
        queue: collections.deque[int] = collections.deque()

        def steps_recorded(steps: Any, *args: Any, **kwargs: Any) -> Any:
            queue.clear()
            # the ledger hears them in this order; a session not started yet starts at the first
            queue.extend(steps[1:] if session.ledger.start_time is None else steps)
            return record_steps(steps, *args, **kwargs)

        def decided(step: int, *args: Any, **kwargs: Any) -> Any:
            decision = decide(step, *args, **kwargs)
            if decision.save and not self.is_on(step):
                decision = dataclasses.replace(decision, save=False, reason="held back: an off block of the A/B")
            return decision

        def ledger_step(seconds: float, loaded: bool) -> None:
            step = queue.popleft() if queue else max(self.loaded, default=0) + 1
            self.loaded[step] = bool(loaded)
            record(seconds, loaded)

        session.decide = decided
        session.record_steps = steps_recorded
        session.ledger.step = ledger_step
        self._session = session

    def figures(self, durations: Mapping[int, float],
                outlier_factor: float | None = OUTLIER_FACTOR) -> dict[str, Any]:
        """:func:`ab_figures` of per-step ``durations`` (global step → seconds; the warm-up's
        are dropped) in this alternation's blocks, the spill guard half a block."""
        kept = {s: t for s, t in durations.items() if s > self.warmup}
        on = {s: self.is_on(s) for s in kept}
        return ab_figures(kept, on, self.busy_after, self.loaded, guard=self.block // 2,
                          outlier_factor=outlier_factor)

    def step_done(self, step: int) -> None:
        """Global step ``step`` ended (after every callback's hook): note whether a persist still runs."""
        session = self._session
        self.busy_after[step] = bool(session is not None and session.writer.busy)


@dataclasses.dataclass
class _Block:
    on: bool
    steps: list[int]


def _blocks(steps: list[int], alternation_on: Mapping[int, bool]) -> list[_Block]:
    blocks: list[_Block] = []
    for s in steps:
        if blocks and blocks[-1].on == alternation_on[s]:
            blocks[-1].steps.append(s)
        else:
            blocks.append(_Block(alternation_on[s], [s]))
    return blocks


def ab_figures(durations: Mapping[int, float], on: Mapping[int, bool], busy_after: Mapping[int, bool],
               loaded: Mapping[int, bool], guard: int,
               outlier_factor: float | None = OUTLIER_FACTOR) -> dict[str, Any]:
    """The A/B's figures from per-step wall times ``durations`` (global step → seconds, steps
    after the warm-up), ``on`` (checkpoints taken in that step's block), ``busy_after`` (a
    persist still ran when the step ended) and ``loaded`` (the in-run meter's flag).

    Returns ``ab_overhead``, ``ab_noise``, ``ab_cycles`` (per-cycle overheads),
    ``ab_meter_view``, ``ab_reference_spread`` ((max − min) / median of the off blocks'
    reference means), ``ab_spill_steps`` (median spill length), ``ab_blocks`` (``[on, steps,
    mean step seconds]`` per block, in order, outliers included) and ``ab_excluded`` (``[step,
    seconds, charged]`` per step left out); overheads are fractions,
    None where fewer than one full cycle (an on block followed by an off block) was run.
    ``outlier_factor`` None keeps every step: where step times are the host's view of an
    asynchronous device, a checkpoint's step waits for the queued steps and looks like a stall.
    """
    typical = statistics.median(durations.values()) if durations else 0.0
    outliers = ({s for s, t in durations.items() if t > outlier_factor * typical}
                if outlier_factor is not None else set())
    steps = sorted(durations)
    blocks = _blocks(steps, on)
    if blocks and not blocks[0].on:
        blocks = blocks[1:]
    refs: list[float | None] = []  # per off block: mean of its reference steps
    spills: list[list[int]] = []
    for block in blocks:
        if block.on:
            continue
        n = 0
        while n < len(block.steps) and busy_after.get(block.steps[n], False):
            n += 1
        n = min(len(block.steps), n + guard)
        spills.append(block.steps[:n])
        rest = [s for s in block.steps[n:] if s not in outliers]
        refs.append(statistics.fmean(durations[s] for s in rest) if rest else None)
    cycles: list[float] = []
    meter: list[tuple[float, float]] = []
    charged_steps: set[int] = set()
    ons = [b for b in blocks if b.on]
    for i, block in enumerate(ons):
        if i >= len(refs):  # the run ended in this on block: no spill, no reference after it
            break
        around = [r for r in (refs[i - 1] if i > 0 else None, refs[i]) if r is not None]
        if not around:
            continue
        ref = statistics.fmean(around)
        charged = [s for s in block.steps + spills[i] if s not in outliers]
        charged_steps.update(block.steps + spills[i])
        kept = [s for s in block.steps if s not in outliers]
        if not kept:
            continue
        cost = sum(durations[s] for s in charged) - len(charged) * ref
        cycles.append(cost / (len(kept) * ref))
        clean = [durations[s] for s in kept if not loaded.get(s, False)]
        if clean:
            m = statistics.fmean(clean)
            extra = sum(durations[s] - m for s in charged if loaded.get(s, False))
            meter.append((extra, len(kept) * m))
    known = [r for r in refs if r is not None]
    means = [[b.on, len(b.steps), statistics.fmean(durations[s] for s in b.steps)] for b in blocks]
    return {
        "ab_overhead": statistics.fmean(cycles) if cycles else None,
        "ab_noise": statistics.stdev(cycles) / math.sqrt(len(cycles)) if len(cycles) > 1 else None,
        "ab_cycles": cycles,
        "ab_meter_view": sum(e for e, _ in meter) / sum(w for _, w in meter) if meter else None,
        "ab_reference_spread": (max(known) - min(known)) / statistics.median(known) if len(known) > 1 else None,
        "ab_spill_steps": statistics.median(len(s) for s in spills) if spills else None,
        "ab_blocks": means,
        "ab_excluded": [[s, durations[s], s in charged_steps] for s in sorted(outliers)],
    }
