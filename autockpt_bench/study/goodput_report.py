"""What one method's killed-and-rerun job cost, from its attempts and event log, and what the
simulator predicts for the same measured costs (pure; see ``autockpt goodput``).

:func:`account` turns the attempts (:mod:`.kill_loop`) and the worker's events
(:mod:`.protocol`, ``goodput`` case) into wall time, kills, steps redone, restart time and
checkpoint costs. :func:`predict` feeds those measured costs to
:func:`~autockpt_core.policy.simulate.simulate`: once on the very failure history the run met
(``replay``: one job, the same seed, so the same kill times) and once as an expectation over
many jobs (``expected``).
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from autockpt_core.policy.simulate import Failures, Job, simulate

from .kill_loop import Attempt


def _in(attempt: Attempt, event: dict[str, Any]) -> bool:
    return attempt.started - 1e-3 <= float(event["t"]) <= attempt.ended + 1e-3


def account(attempts: Sequence[Attempt], events: Sequence[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Wall time, kills, restarts, steps redone and checkpoint figures of one method's job."""
    per: list[dict[str, Any]] = []
    for a in attempts:
        mine = [e for e in events if _in(a, e)]
        resumed = next((e for e in mine if e["event"] == "resumed"), None)
        stepped = [int(e["step"]) for e in mine if e["event"] == "step"]
        per.append({
            "wall_s": a.wall_s, "killed": a.killed, "gap_s": a.gap_s,
            "resumed_step": int(resumed["step"]) if resumed else None,
            "ready_s": float(resumed["t"]) - a.started if resumed else None,
            "last_step": max(stepped) if stepped else None,
        })
    trained = sum(p["last_step"] - p["resumed_step"] for p in per if p["last_step"] is not None and p["resumed_step"] is not None)
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    done = next((e for e in reversed(events) if e["event"] == "done"), None)
    ready = [p["ready_s"] for p in per if p["ready_s"] is not None]
    return {
        "wall_s": sum(a.wall_s for a in attempts),
        "kills": sum(1 for a in attempts if a.killed),
        "attempts": len(attempts),
        "finished": done is not None and int(done["step"]) >= steps,
        "steps_trained": trained,
        "steps_redone": max(0, trained - steps),
        "restart_s": statistics.median(ready) if ready else None,
        "checkpoints": len(checkpoints),
        "checkpoint_steps": sorted({int(e["step"]) for e in checkpoints}),
        "blocked_ms": statistics.median(float(e["blocked_s"]) for e in checkpoints) * 1e3 if checkpoints else None,
        "persist_s": (done or {}).get("persist_s"),
        "per_attempt": per,
    }


def compute_rate(events: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """``(seconds per step, startup seconds)`` of an uninterrupted run without checkpointing.

    Seconds per step: the median gap between consecutive step events (robust to the first step's
    one-off costs); startup: first event ("start") to "resumed", i.e. imports, model and data.
    """
    steps = [(int(e["step"]), float(e["t"])) for e in events if e["event"] == "step"]
    gaps = [t2 - t1 for (s1, t1), (s2, t2) in zip(steps, steps[1:]) if s2 == s1 + 1]
    if not gaps:
        raise ValueError("the calibration run logged fewer than two consecutive steps")
    start = next(float(e["t"]) for e in events if e["event"] == "start")
    resumed = next(float(e["t"]) for e in events if e["event"] == "resumed")
    return statistics.median(gaps), resumed - start


def predict(
    method: dict[str, Any],
    *,
    steps: int,
    step_s: float,
    startup_s: float,
    failure_free_s: float,
    mtbf_s: float,
    seed: int,
    jobs: int,
) -> dict[str, Any]:
    """The simulator's wall time for the method's measured costs: on the same kills, and expected.

    Model inputs (all measured in this run): work = ``steps × step_s``; stall = the method's median
    blocked time per checkpoint; persist = its background persist time (0 when synchronous);
    restart = its median time from process start to training (``startup_s`` of the reference run
    where it was never restarted); checkpoint positions = the steps it checkpointed at × step_s.
    """
    stall = (method.get("blocked_ms") or 0.0) / 1e3
    restart = method.get("restart_s") or startup_s
    job = Job(work_s=steps * step_s, stall_s=stall, persist_s=float(method.get("persist_s") or 0.0),
              restart_s=restart, startup_s=restart)
    positions = [s * step_s for s in method.get("checkpoint_steps", []) if 0 < s < steps]
    failures = Failures(mtbf_s)
    out: dict[str, Any] = {"inputs": {"work_s": job.work_s, "stall_s": stall, "persist_s": job.persist_s,
                                      "restart_s": restart, "checkpoints": len(positions)}}
    for name, n, s in (("replay", 1, seed), ("expected", jobs, seed + 1)):
        r = simulate(positions, job, failures, jobs=n, seed=s)
        out[name] = {"wall_s": r.wall_s, "kills": r.failures, "rework_s": r.rework_s,
                     "slowdown_factor": r.wall_s / failure_free_s}
    out["slowdown_factor"] = out["expected"]["slowdown_factor"]
    return out


def combine(per_seed: Sequence[dict[str, Any]], failure_free_s: float) -> dict[str, Any]:
    """One row from a method's runs on several failure histories: medians, and the min–max of wall time.

    ``per_seed`` are :func:`account` results with ``slowdown_factor`` (and ``predicted`` where the
    simulator ran); they are kept under ``"seeds"``.
    """

    def med(key: str) -> Any:
        vals = [r[key] for r in per_seed if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    walls = [r["wall_s"] for r in per_seed]
    row: dict[str, Any] = {key: med(key) for key in ("wall_s", "kills", "attempts", "steps_redone", "restart_s",
                                                     "checkpoints", "blocked_ms", "persist_s", "slowdown_factor")}
    row["finished"] = all(r["finished"] for r in per_seed)
    notes = sorted({r["note"] for r in per_seed if r.get("note")})
    if notes:
        row["note"] = "; ".join(notes)
    row["wall_spread_s"] = [min(walls), max(walls)] if len(walls) > 1 else None
    row["waste_s"] = row["wall_s"] - failure_free_s
    row["checkpoint_steps"] = per_seed[0].get("checkpoint_steps", [])
    preds = [r["predicted"] for r in per_seed if r.get("predicted")]
    if preds:
        row["predicted"] = {
            "inputs": preds[0]["inputs"],
            "replay": {k: statistics.median(p["replay"][k] for p in preds) for k in ("wall_s", "kills", "slowdown_factor")},
            "expected": {k: statistics.median(p["expected"][k] for p in preds) for k in ("wall_s", "kills", "slowdown_factor")},
        }
        row["predicted"]["slowdown_factor"] = row["predicted"]["expected"]["slowdown_factor"]
    row["seeds"] = list(per_seed)
    return row
