"""Monte Carlo failure simulator: what a checkpoint schedule costs under random failures.

One simulated job must do ``work_s`` seconds of compute. A schedule is a sorted list of
checkpoint positions in compute seconds (or a uniform interval). At each checkpoint the
training thread stalls ``stall_s`` (time that makes no progress; fold any background slowdown
into it); the checkpoint becomes durable ``persist_s`` wall seconds after the stall ended.
Failures arrive as a renewal process (exponential, or Weibull with shape < 1: failures come in
bursts) that restarts after every failure. A failure loses everything since the last *durable*
checkpoint; the job then spends ``restart_s`` restarting (a failure during the restart restarts
it again) and resumes from that checkpoint. ``startup_s`` is the same for the very first start
(process start and imports before the first step; 0 by default, as in the papers' model).

Per job it records wall time, wasted time (wall − work), reworked compute, failures,
checkpoints taken and value lost (``value(progress)`` before the failure minus at the restored
checkpoint; by default value is proportional to progress).

Vectorised over jobs with numpy; one loop iteration per failure "round". Common random
numbers: job ``i`` sees the same uniform draws in every call with the same seed, so schedules
are compared on identical failure histories (differences are far more precise than each mean).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

ValueFn = Callable[[np.ndarray], np.ndarray]

#: Failure rounds after which a simulation is declared hopeless (the job cannot finish).
MAX_ROUNDS = 100_000


@dataclasses.dataclass(frozen=True)
class Failures:
    """Time between failures: Weibull with the given mean; ``shape = 1`` is exponential."""

    mtbf_s: float
    shape: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mtbf_s) and self.mtbf_s > 0):
            raise ValueError(f"mtbf_s must be positive, got {self.mtbf_s}")
        if not (self.shape > 0):
            raise ValueError(f"Weibull shape must be positive, got {self.shape}")

    @property
    def scale_s(self) -> float:
        return self.mtbf_s / math.gamma(1.0 + 1.0 / self.shape)

    def from_uniform(self, u: np.ndarray) -> np.ndarray:
        """Inverse CDF: failure gaps from uniform draws in [0, 1)."""
        e = -np.log1p(-u)
        return self.scale_s * (e if self.shape == 1.0 else e ** (1.0 / self.shape))


@dataclasses.dataclass(frozen=True)
class Job:
    """One training job: compute to do and what checkpoints and restarts cost (seconds)."""

    work_s: float
    stall_s: float
    persist_s: float = 0.0
    restart_s: float = 0.0
    startup_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.work_s > 0:
            raise ValueError(f"work_s must be positive, got {self.work_s}")
        for name in ("stall_s", "persist_s", "restart_s", "startup_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class SimResult:
    """Means over the simulated jobs (seconds unless noted); ``*_se`` are standard errors."""

    jobs: int
    planned_checkpoints: int
    wall_s: float
    waste_s: float
    waste_se: float
    rework_s: float
    failures: float
    checkpoints: float
    value_lost: float
    value_lost_se: float
    work_s: float

    @property
    def waste_fraction(self) -> float:
        """Expected waste as a fraction of the failure-free compute time."""
        return self.waste_s / self.work_s

    def as_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "waste_fraction": self.waste_fraction}


def uniform_positions(interval_s: float, work_s: float) -> np.ndarray:
    """Checkpoints every ``interval_s`` compute seconds, strictly before the end of the work."""
    if not interval_s > 0:
        raise ValueError(f"interval must be positive, got {interval_s}")
    n = max(0, math.ceil(work_s / interval_s) - 1)
    return interval_s * np.arange(1, n + 1, dtype=float)


def simulate(
    schedule: float | Sequence[float] | np.ndarray,
    job: Job,
    failures: Failures,
    *,
    jobs: int = 100_000,
    seed: int = 0,
    value: ValueFn | None = None,
    max_rounds: int = MAX_ROUNDS,
) -> SimResult:
    """Simulate ``jobs`` runs of ``job`` under ``failures`` with the given checkpoint schedule.

    ``schedule``: a uniform interval (compute seconds) or checkpoint positions in compute
    seconds. ``value(progress_s)`` maps progress to cumulative value (vectorised; default
    ``progress / work``, so value lost is the reworked fraction). Raises ``ValueError`` if some
    job still runs after ``max_rounds`` failures (failures too frequent to ever finish).
    """
    if np.ndim(schedule) == 0:
        pos = uniform_positions(float(schedule), job.work_s)  # type: ignore[arg-type]
    else:
        pos = np.asarray(schedule, dtype=float)
        if pos.size and (np.any(np.diff(pos) <= 0) or pos[0] <= 0):
            raise ValueError("checkpoint positions must be positive and strictly increasing")
        pos = pos[pos < job.work_s]
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    value_fn: ValueFn = value if value is not None else (lambda p: p / job.work_s)
    m, d = pos.size, job.stall_s
    s_start = pos + d * np.arange(m)  # schedule position (wall since segment 0 minus lost time)
    s_end = s_start + d
    durable = s_end + job.persist_s
    total = job.work_s + d * m
    # index -1 = "no checkpoint": progress 0, position 0
    pos_x = np.concatenate(([0.0], pos))
    end_x = np.concatenate(([0.0], s_end))
    val_x = np.concatenate(([float(value_fn(np.zeros(1))[0])], value_fn(pos))) if m else value_fn(np.zeros(1))

    rng = np.random.default_rng(seed)
    idx = np.arange(jobs)  # the jobs still running
    j0 = np.zeros(jobs, dtype=np.int64)  # 1 + index of the last durable checkpoint (0: none)
    wall, rework, lost, nfail, nckpt = (np.zeros(jobs) for _ in range(5))
    out = {name: np.zeros(jobs) for name in ("wall", "rework", "lost", "nfail", "nckpt")}
    restart = job.startup_s  # the first segment starts after the startup (0: at once)
    for _ in range(max_rounds):
        gaps = failures.from_uniform(rng.random(jobs))[idx]  # all draws made: common random numbers
        base = end_x[j0]
        avail = gaps - restart
        q = base + avail
        finished = (avail >= 0) & (q >= total)
        failed = (avail >= 0) & ~finished  # failed while computing (else: during the restart)
        qf = np.where(failed, q, 0.0)
        started = np.searchsorted(s_start, qf, side="right")  # checkpoints begun before q
        done = np.searchsorted(s_end, qf, side="right")  # ... and whose stall ended
        progress = np.where(started > done, pos_x[started], qf - d * done)  # in a stall: stuck
        new_j0 = np.maximum(j0, np.searchsorted(durable, qf, side="right"))
        nckpt += np.where(finished, m - j0, np.where(failed, np.maximum(done - j0, 0), 0))
        rework += np.where(failed, progress - pos_x[new_j0], 0.0)
        if failed.any():
            lost += np.where(failed, value_fn(progress) - val_x[new_j0], 0.0)
        nfail += ~finished
        wall += np.where(finished, restart + (total - base), gaps)
        j0 = np.where(failed, new_j0, j0)
        if finished.any():
            ids = idx[finished]
            for name, arr in (("wall", wall), ("rework", rework), ("lost", lost), ("nfail", nfail), ("nckpt", nckpt)):
                out[name][ids] = arr[finished]
            keep = ~finished
            if not keep.any():
                break
            idx, j0 = idx[keep], j0[keep]
            wall, rework, lost, nfail, nckpt = (a[keep] for a in (wall, rework, lost, nfail, nckpt))
        restart = job.restart_s
    else:
        raise ValueError(
            f"simulation did not finish after {max_rounds} failure rounds: failures (MTBF "
            f"{failures.mtbf_s:g}s) are too frequent for this restart cost and schedule"
        )
    waste = out["wall"] - job.work_s
    se = math.sqrt(jobs)
    return SimResult(
        jobs=jobs,
        planned_checkpoints=m,
        wall_s=float(out["wall"].mean()),
        waste_s=float(waste.mean()),
        waste_se=float(waste.std() / se),
        rework_s=float(out["rework"].mean()),
        failures=float(out["nfail"].mean()),
        checkpoints=float(out["nckpt"].mean()),
        value_lost=float(out["lost"].mean()),
        value_lost_se=float(out["lost"].std() / se),
        work_s=job.work_s,
    )


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """Outcome of :func:`best_uniform_interval`: the best interval and every one evaluated."""

    best_s: float
    best: SimResult
    sweep: tuple[tuple[float, SimResult], ...]


def best_uniform_interval(
    job: Job,
    failures: Failures,
    *,
    lo_s: float | None = None,
    hi_s: float | None = None,
    points: int = 25,
    refine: int = 9,
    jobs: int = 20_000,
    seed: int = 0,
    objective: str = "waste",
    value: ValueFn | None = None,
) -> SearchResult:
    """Brute force: the uniform interval with the least expected ``objective`` ("waste" or "value").

    A log-spaced sweep of ``points`` intervals over ``[lo_s, hi_s]`` (default: Young's interval
    /8 to ×8), then ``refine`` more between the best one's neighbours. All runs share ``seed``
    (common random numbers), so the comparison is not blurred by sampling noise.
    """
    if objective not in ("waste", "value"):
        raise ValueError(f"objective must be 'waste' or 'value', got {objective!r}")
    young = math.sqrt(2.0 * max(job.stall_s, 1e-9) * failures.mtbf_s)
    lo = lo_s if lo_s is not None else young / 8.0
    hi = min(hi_s if hi_s is not None else young * 8.0, job.work_s)
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo_s < hi_s, got {lo!r}, {hi!r}")

    def score(r: SimResult) -> float:
        return r.waste_s if objective == "waste" else r.value_lost

    def run(taus: np.ndarray) -> list[tuple[float, SimResult]]:
        return [(float(t), simulate(float(t), job, failures, jobs=jobs, seed=seed, value=value)) for t in taus]

    coarse = np.geomspace(lo, hi, points)
    sweep = run(coarse)
    i = min(range(len(sweep)), key=lambda j: score(sweep[j][1]))
    if refine > 0:
        a, b = coarse[max(i - 1, 0)], coarse[min(i + 1, len(coarse) - 1)]
        sweep += run(np.geomspace(a, b, refine + 2)[1:-1])
    sweep.sort(key=lambda pair: pair[0])
    best_s, best = min(sweep, key=lambda pair: score(pair[1]))
    return SearchResult(best_s, best, tuple(sweep))
