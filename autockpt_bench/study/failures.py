"""The failure times of ``autockpt goodput``: seeded, and the same draws the simulator makes.

:func:`kill_gaps` yields the seconds after each process start at which that process is
SIGKILLed. It draws exactly as :func:`autockpt_core.policy.simulate.simulate` does for one job
with the same seed (one uniform per failure round, mapped by :meth:`Failures.from_uniform`), so
the simulator can replay the very failure history the real run went through, and every
checkpointing method meets the same failures.
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
