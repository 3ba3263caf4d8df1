"""The failure times of ``autockpt goodput``: seeded, and the same draws the simulator makes.

:func:`kill_gaps` yields the seconds after each process start at which that process is
SIGKILLed. It draws exactly as :func:`autockpt_core.policy.simulate.simulate` does for one job
with the same seed (one uniform per failure round, mapped by :meth:`Failures.from_uniform`), so
the simulator can replay the very failure history the real run went through, and every
checkpointing method meets the same failures. :func:`history_seeds` picks the seeds whose first
kill falls while the job trains: a history without a failure says nothing about checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from autockpt_core.policy.simulate import Failures


def kill_gaps(mtbf_s: float, seed: int, shape: float = 1.0) -> Iterator[float]:
    """Endless seeded gaps (seconds) between a process start and its kill."""
    failures = Failures(mtbf_s, shape)
    rng = np.random.default_rng(seed)
    while True:
        yield float(failures.from_uniform(rng.random(1))[0])


def history_seeds(mtbf_s: float, first_seed: int, count: int, *, after_s: float, before_s: float,
                  shape: float = 1.0, max_tries: int = 10_000) -> list[int]:
    """The first ``count`` seeds from ``first_seed`` on whose first kill falls while the job
    trains (``after_s <= gap < before_s``: after a process's startup, before a failure-free
    run would end), so every failure history has at least one failure in it.

    Seeds are skipped, draws are not changed: the simulator's replay of a seed is still the
    history the run met. Raises ``ValueError`` (naming the fix) when too few seeds qualify:
    the MTBF is then far longer than the job.
    """
    if before_s <= after_s:
        raise ValueError(f"the job ends before its startup does ({before_s:.1f} s <= {after_s:.1f} s)")
    seeds: list[int] = []
    for seed in range(first_seed, first_seed + max_tries):
        if after_s <= next(kill_gaps(mtbf_s, seed, shape)) < before_s:
            seeds.append(seed)
            if len(seeds) == count:
                return seeds
    raise ValueError(
        f"--mtbf {mtbf_s:g}s: fewer than {count} of {max_tries} seeds kill a {before_s:.0f} s job while it trains; "
        "give an --mtbf below a few times --work (or a longer --work)")
