"""The per-step agreement of a job with several processes, as numbers any collective can carry.

Only one process (rank 0) runs the checkpoint session and decides; every process must still
do the same thing at each step boundary: checkpoint or not, stop after a signal that reached
any of them, stop when any of them failed. Each rank packs what it knows into
:data:`WIDTH` float64 numbers (:func:`encode`); the collective takes their element-wise
maximum over ranks (an all-reduce with MAX, or :func:`combine` over an all-gather), and
every rank reads the same :class:`Agreement` back (:func:`decode`).

The decisions (``save``, ``unclean``) count on rank 0 only, so ranks whose clocks or loop
views differ never disagree; a signal, a failure and the step times count on every rank.
Float64 carries the integers (signal numbers, ranks) exactly. Pure: no framework, no clock.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .rank_timing import RankTimes

WIDTH = 6
"""How many numbers one rank contributes."""


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What every rank does at this step boundary (the same on all ranks)."""

    save: bool  # rank 0's decision
    unclean: bool  # rank 0's view: this boundary cannot be resumed exactly (defer by one step)
    signum: int | None  # a signal any rank received (the largest number if several)
    failed_rank: int | None  # the highest-numbered rank that failed before this point, if any
    slowest: RankTimes  # the slowest rank's step and checkpoint-blocked times (each a maximum)


def encode(
    rank: int,
    *,
    save: bool = False,
    unclean: bool = False,
    signum: int | None = None,
    failed: bool = False,
    times: RankTimes = RankTimes(0.0, 0.0),
) -> list[float]:
    """This rank's :data:`WIDTH` numbers (``save`` and ``unclean`` are dropped off rank 0)."""
    rank0 = rank == 0
    return [
        float(save and rank0),
        float(unclean and rank0),
        float(signum or 0),
        float(rank + 1 if failed else 0),
        float(times.step_s),
        float(times.blocked_s),
    ]


def combine(vectors: Sequence[Sequence[float]]) -> list[float]:
    """The element-wise maximum of every rank's numbers (what an all-reduce with MAX gives)."""
    if not vectors or any(len(v) != WIDTH for v in vectors):
        raise ValueError(f"expected one vector of {WIDTH} numbers per rank, got {[len(v) for v in vectors]}")
    return [max(column) for column in zip(*vectors)]


def decode(values: Sequence[float]) -> Agreement:
    """The agreement the combined numbers say."""
    if len(values) != WIDTH:
        raise ValueError(f"expected {WIDTH} numbers, got {len(values)}")
    save, unclean, signum, failed, step_s, blocked_s = (float(v) for v in values)
    return Agreement(
        save=bool(save),
        unclean=bool(unclean),
        signum=int(signum) or None,
        failed_rank=int(failed) - 1 if failed else None,
        slowest=RankTimes(step_s, blocked_s),
    )
