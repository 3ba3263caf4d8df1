"""The overhead a run really paid for checkpointing, measured, with its noise.

Not the time the hooks blocked: the wall time of every step since warm-up against what the
same steps take without checkpoint work. Steps that overlapped no snapshot copy and no persist
are *clean*; their mean ``m`` (and spread ``σ``) stand for the run without checkpointing. Then

    extra = Σ loaded steps + Σ blocked time − n_loaded · m
    overhead = extra / (n · m)          (n: every step counted)

This is what the checkpoints cost, the figure the budget bounds. *Hook time*, the time
autockpt's own per-step work took (timed by the driver), is reported beside it as ``hooks``
(``Σ hook time / (n · m)``): clean steps pay it as well, so the comparison with them cannot show
it; it is measured directly (it carries no noise of its own). ``m`` includes it, which
understates both figures by a factor ``1 − h/m`` (negligible at microseconds per step).

The mean, not the median: a baseline's step time is a mean, and the slow outliers it has
(a GC pause, a page-cache flush) fall in clean steps too. Noise: the loaded steps each carry
``σ`` and are compared with one estimated mean, so
``sd(extra) = σ·√(n_l + n_l²/n_c)`` (:meth:`Overhead.noise`). Effects that outlast every
copy and persist (cache pollution) land in clean steps and are not seen, nor is what the hooks
cost the framework's own code around them (caches they evict): a benchmark against a run
without the callback measures those.

A step more than five times the clean mean (:mod:`.giant_steps`: a machine's stall, which a
run without checkpoints pays too) is *left out* of both sides, and counted in ``left_out`` and
``left_out_s``, until such steps are clearly more frequent among loaded steps than among clean
ones; from then on they count in full, as the checkpoints' cost.

Call order (training thread, driven by :class:`~autockpt_core.session.CheckpointSession`):
``step(seconds, loaded)`` after every optimizer step (its own blocked time subtracted; the
first ``warmup`` steps are not counted), ``revise_last_step(seconds)`` when the slowest rank's
time replaces it, ``blocked(seconds)`` for every blocked interval, ``hooks(seconds)`` after a
step's hook (not counted for the warm-up steps), ``reading()`` at any time.
Pure: no clock, no threads.
"""

from __future__ import annotations

import dataclasses
import math

from .giant_steps import MIN_REFERENCE, GiantRates, is_giant
from .stats import excess_sd

#: Half-width of the band shown with an overhead, in standard deviations (about 95%).
BAND_SD = 2.0


@dataclasses.dataclass(frozen=True)
class Overhead:
    """One reading: ``value`` (a fraction, e.g. 0.012 = 1.2%) and ``noise`` (its standard
    deviation from step-to-step noise); both None until two clean steps and one loaded step or
    blocked interval were counted. ``steps``: the steps counted. ``left_out``/``left_out_s``:
    giant steps not counted (see the module docstring) and their seconds. ``hooks``: autockpt's
    own per-step work as a fraction of the step time (None until two clean steps were counted),
    not part of ``value``."""

    value: float | None
    noise: float | None
    steps: int
    left_out: int = 0
    left_out_s: float = 0.0
    hooks: float | None = None

    @property
    def band(self) -> float | None:
        """Half-width of the ~95% band around ``value``."""
        return None if self.noise is None else BAND_SD * self.noise

    def resolves(self, budget: float) -> bool:
        """See :func:`resolves`."""
        return resolves(self.value, self.band, budget)

    def text(self, budget: float) -> str:
        """See :func:`overhead_text`."""
        return overhead_text(self.value, self.band, budget)


def resolves(value: float | None, band: float | None, budget: float) -> bool:
    """True when the band is narrower than ``budget``, or lies wholly above it: this run's
    noise allows saying whether the overhead kept the budget."""
    if value is None or band is None:
        return False
    return band < budget or value - band > budget


def overhead_text(value: float | None, band: float | None, budget: float) -> str:
    """``"1.23% ±0.40% (budget 2.00%)"``; where the noise is larger than the budget, that,
    instead of a number that looks precise."""
    if value is None or band is None:
        return f"n/a (budget {budget * 100:.2f}%)"
    if resolves(value, band, budget):
        return f"{value * 100:.2f}% ±{band * 100:.2f}% (budget {budget * 100:.2f}%)"
    return f"unresolved (step-time noise ±{band * 100:.2f}% > budget {budget * 100:.2f}%)"


class OverheadMeter:
    """Sums one run's steps and blocked time; see the module docstring for the call order."""

    def __init__(self, warmup: int = 0) -> None:
        self._warmup = max(0, int(warmup))
        self._seen = 0
        self._clean_n = 0
        self._clean_mean = 0.0
        self._clean_m2 = 0.0  # Welford: sum of squared deviations
        self._loaded_n = 0
        self._loaded_sum = 0.0
        self._blocked = 0.0
        self._hooks = 0.0
        self._giants: dict[bool, list[float]] = {False: [], True: []}  # by loaded: giant steps' seconds
        self.giant_rates = GiantRates()
        self._last: tuple[float, bool, bool] | None = None  # the newest counted step: seconds, loaded, giant

    def step(self, seconds: float, loaded: bool) -> None:
        """One optimizer step's duration, its own blocked time subtracted; ``loaded``: it
        overlapped a snapshot copy or a persist."""
        self._seen += 1
        self._last = None
        if self._seen <= self._warmup or seconds < 0:
            return
        self._last = (seconds, loaded, self._count(seconds, loaded))

    def revise_last_step(self, seconds: float) -> None:
        """Replace the newest counted step's duration (a no-op when it was not counted)."""
        if self._last is None:
            return
        old, loaded, giant = self._last
        self.giant_rates.count(loaded, giant, -1)
        if giant:
            self._giants[loaded].pop()
        else:
            self._add(old, loaded, -1)
        seconds = max(0.0, seconds)
        self._last = (seconds, loaded, self._count(seconds, loaded))

    def _count(self, seconds: float, loaded: bool) -> bool:
        """Count one step; whether it is a giant (kept apart)."""
        typical = self._clean_mean if self._clean_n >= MIN_REFERENCE else None
        giant = is_giant(seconds, typical)
        self.giant_rates.count(loaded, giant)
        if giant:
            self._giants[loaded].append(seconds)
        else:
            self._add(seconds, loaded, +1)
        return giant

    def blocked(self, seconds: float) -> None:
        """The training thread was blocked ``seconds`` by checkpoint work."""
        self._blocked += max(0.0, seconds)

    def hooks(self, seconds: float) -> None:
        """autockpt's own work in the hook of the step just counted took ``seconds``."""
        if self._seen > self._warmup:
            self._hooks += max(0.0, seconds)

    def _add(self, seconds: float, loaded: bool, sign: int) -> None:
        if loaded:
            self._loaded_n += sign
            self._loaded_sum += sign * seconds
            return
        if sign > 0:
            self._clean_n, self._clean_mean, self._clean_m2 = _welford_add(
                self._clean_n, self._clean_mean, self._clean_m2, seconds)
        else:  # Welford, reversed
            if self._clean_n <= 1:
                self._clean_n, self._clean_mean, self._clean_m2 = 0, 0.0, 0.0
                return
            mean = (self._clean_n * self._clean_mean - seconds) / (self._clean_n - 1)
            self._clean_m2 -= (seconds - self._clean_mean) * (seconds - mean)
            self._clean_n -= 1
            self._clean_mean = mean

    def reading(self) -> Overhead:
        """The overhead so far, with its noise."""
        n_c, n_l, m, m2, loaded_sum = self._clean_n, self._loaded_n, self._clean_mean, self._clean_m2, self._loaded_sum
        left_out, left_out_s = 0, 0.0
        if self.giant_rates.checkpoint_caused():
            for seconds in self._giants[False]:
                n_c, m, m2 = _welford_add(n_c, m, m2, seconds)
            n_l += len(self._giants[True])
            loaded_sum += sum(self._giants[True])
        else:
            left_out = len(self._giants[False]) + len(self._giants[True])
            left_out_s = sum(self._giants[False]) + sum(self._giants[True])
        steps = n_c + n_l
        if n_c < 2 or m <= 0:
            return Overhead(None, None, steps, left_out, left_out_s)
        work = steps * m
        hooks = self._hooks / work
        if n_l == 0 and self._blocked == 0:
            return Overhead(None, None, steps, left_out, left_out_s, hooks)
        sd = math.sqrt(max(m2, 0.0) / (n_c - 1))
        extra = loaded_sum + self._blocked - n_l * m
        noise = excess_sd(sd, n_l, n_c)
        return Overhead(extra / work, noise / work, steps, left_out, left_out_s, hooks)


def _welford_add(n: int, mean: float, m2: float, value: float) -> tuple[int, float, float]:
    """Count, mean and sum of squared deviations with ``value`` added (Welford)."""
    n += 1
    delta = value - mean
    mean += delta / n
    return n, mean, m2 + delta * (value - mean)
