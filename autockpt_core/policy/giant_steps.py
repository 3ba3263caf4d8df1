"""Steps far longer than the rest: a stall of the machine, or one a checkpoint caused?

A step more than :data:`GIANT_FACTOR` times the typical clean step (a Keras epoch start that
stalls 20 s on a busy machine, a swap-in, a scheduler pause) decides a whole window's cost or a
run's overhead on its own. One such step tells nothing about its cause: it happens with and
without checkpoints. Many tell: if checkpoints cause them, they are more frequent among the
steps that overlap checkpoint work (*loaded*) than among the others (*clean*).

:class:`GiantRates` counts both and answers :meth:`~GiantRates.checkpoint_caused`: the loaded
steps' giants are more than chance at the clean steps' rate would give (a one-sided binomial
test at :data:`SIGNIFICANCE`, the clean rate taken as (giants + 1)/(steps + 2), so that no giant
among few clean steps is not read as a rate of zero). Until then the meters leave giant steps
out of both sides (what a run without checkpoints would have paid as well) and say so; once it
holds, they count them in full, as a cost of the checkpoints.

Pure (no clock, no threads); each consumer keeps its own counts, on the training thread.
"""

from __future__ import annotations

import dataclasses

__all__ = ["GIANT_FACTOR", "GiantRates", "binomial_tail", "is_giant"]

#: A step longer than this many typical clean steps is a giant.
GIANT_FACTOR = 5.0
#: Clean steps measured before any step is judged (the typical step is not known before).
MIN_REFERENCE = 5
#: The loaded steps' giants count as the checkpoints' when chance gives as many this rarely.
SIGNIFICANCE = 0.05


def is_giant(seconds: float, typical_s: float | None) -> bool:
    """Whether a step of ``seconds`` is a giant against a typical clean step of ``typical_s``
    (None or ≤ 0: not known yet, never a giant)."""
    return typical_s is not None and typical_s > 0 and seconds > GIANT_FACTOR * typical_s


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    term = (1.0 - p) ** n  # P(X = 0)
    below = 0.0
    ratio = p / (1.0 - p)
    for i in range(k):
        below += term
        term *= (n - i) / (i + 1) * ratio
    return max(0.0, 1.0 - below)


@dataclasses.dataclass
class GiantRates:
    """Clean and loaded steps counted, and how many of each were giants."""

    clean: int = 0
    clean_giants: int = 0
    loaded: int = 0
    loaded_giants: int = 0

    def count(self, loaded: bool, giant: bool, sign: int = 1) -> None:
        """One step (``sign`` −1 takes one back: a revised step)."""
        if loaded:
            self.loaded += sign
            self.loaded_giants += sign * giant
        else:
            self.clean += sign
            self.clean_giants += sign * giant

    @property
    def giants(self) -> int:
        return self.clean_giants + self.loaded_giants

    def checkpoint_caused(self) -> bool:
        """Whether the loaded steps' giants are clearly more frequent than the clean steps'."""
        if self.loaded_giants == 0:
            return False
        p_clean = (self.clean_giants + 1) / (self.clean + 2)
        return binomial_tail(self.loaded_giants, self.loaded, p_clean) < SIGNIFICANCE
