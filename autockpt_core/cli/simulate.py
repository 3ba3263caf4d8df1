"""``autockpt simulate``: compare checkpoint policies under simulated failures, table + PNG plot.

Policies: every epoch, every N steps, CheckFreq's budget/persist bound, Young, Daly, the
front-loaded schedule and autockpt's own choice (:func:`~autockpt_core.policy.decision.choose_interval`,
as at run time), plus the brute-force best uniform interval. All are simulated on the same
failure histories (common random numbers) by :mod:`~autockpt_core.policy.simulate`.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ..policy.decision import IntervalRules, choose_interval
from ..policy.frontload import MAX_STRETCH, ValueModel, horizon_for, schedule_steps
from ..policy.intervals import daly_interval, young_interval
from ..policy.losscurve import LossCurve, fit_loss_curve
from ..policy.simulate import Failures, Job, SimResult, best_uniform_interval, simulate
from ..units import format_duration
from .args import add_cost_arguments, config_from_args, duration, estimates_from_args, read_loss_curve, rounded

HELP = "compare checkpoint policies under simulated failures (table and PNG plot)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cost_arguments(parser, mtbf_required=True)
    parser.add_argument("--work", default="24h", help="failure-free compute time of the job (default 24h)")
    parser.add_argument("--restart", default="5min", help="time to restart and reload after a failure (default 5min)")
    parser.add_argument("--epoch", default="1h", help="epoch length, for the every-epoch policy (default 1h)")
    parser.add_argument("--every", type=int, default=1000, help="N for the every-N-steps policy (default 1000)")
    parser.add_argument("--weibull-shape", type=float, default=1.0, help="1 = exponential; < 1 = bursty (default 1)")
    parser.add_argument("--jobs", type=int, default=20_000, help="simulated jobs per policy (default 20000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the failure draws (default 0)")
    parser.add_argument("--plot", default="autockpt-simulate.png",
                        help="PNG file to write, '' for none (default autockpt-simulate.png)")


def _schedules(args: argparse.Namespace) -> tuple[dict[str, Any], Job, Failures, ValueModel, str, float]:
    config = config_from_args(args)
    est = estimates_from_args(args)
    t = float(est.iter_time_s)  # type: ignore[arg-type]
    stall, persist = float(est.stall_s), float(est.persist_s)  # type: ignore[arg-type]
    work = config.total_steps * t if config.total_steps else duration("--work", args.work)
    if args.every < 1:
        raise ValueError(f"--every must be >= 1, got {args.every}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    job = Job(work, stall, persist, duration("--restart", args.restart, allow_zero=True))
    failures = Failures(float(config.mtbf), args.weibull_shape)  # type: ignore[arg-type]
    horizon = work / t
    if args.loss_curve:
        fit = fit_loss_curve(*read_loss_curve(args.loss_curve))
        if not fit.ok or fit.curve is None:
            raise ValueError(f"--loss-curve: cannot use the curve: {fit.reason}")
        curve, origin = fit.curve, "fitted loss curve"
        horizon = horizon_for(fit, int(horizon))
    else:  # exponential decay reaching 99% of its decrease at the end of the job
        curve, origin = LossCurve(rate=math.log(0.01) / horizon, log_scale=0.0, floor=0.0), "synthetic exp curve"
    model = ValueModel(curve, horizon)
    choice = choose_interval(IntervalRules.of(config), est)
    checkfreq = choose_interval(IntervalRules.of(config.replace(mtbf=None)), est)
    cands = choice.candidates
    lo = max(cands[r] for r in ("budget", "persist", "min_interval") if r in cands)
    front = np.array(schedule_steps(model, cands["daly"], lo, cands.get("max_interval", math.inf), MAX_STRETCH))
    schedules: dict[str, Any] = {
        "every epoch": duration("--epoch", args.epoch),
        f"every {args.every} steps": args.every * t,
        "CheckFreq budget": checkfreq.seconds,
        "Young": young_interval(max(stall, 1e-9), failures.mtbf_s),
        "Daly": daly_interval(max(stall, 1e-9), failures.mtbf_s),
        "front-loaded": front[front * t < work] * t,
        f"autockpt ({choice.rule})": choice.seconds,
    }
    return schedules, job, failures, model, origin, t


def run(args: argparse.Namespace) -> int:
    schedules, job, failures, model, origin, t = _schedules(args)
    value = lambda p: model.cumulative(p / t)  # noqa: E731
    results: dict[str, SimResult] = {
        name: simulate(s, job, failures, jobs=args.jobs, seed=args.seed, value=value) for name, s in schedules.items()
    }
    uniform = [float(s) for s in schedules.values() if np.ndim(s) == 0]
    young = schedules["Young"]
    search = best_uniform_interval(
        job, failures, jobs=args.jobs, seed=args.seed, value=value, points=21, refine=5,
        lo_s=min(young / 8, *uniform) * 0.9, hi_s=max(young * 8, *uniform) * 1.1,
    )
    results["best uniform (brute force)"] = search.best
    schedules["best uniform (brute force)"] = search.best_s
    best_waste = min(r.waste_s for r in results.values())
    rows = [_row(name, schedules[name], r, best_waste) for name, r in results.items()]
    plot = args.plot or None
    if plot:
        _plot(plot, search, rows, failures, origin)
    if args.json:
        print(json.dumps(rounded({"value_model": origin, "rows": rows, "plot": plot}), indent=1))
        return 0
    _print_table(rows, job, failures, args.jobs, origin, plot)
    return 0


def _row(name: str, schedule: Any, r: SimResult, best_waste: float) -> dict[str, Any]:
    uniform = np.ndim(schedule) == 0
    return {
        "policy": name,
        "interval_s": float(schedule) if uniform else None,
        "checkpoints": r.planned_checkpoints,
        "wall_s": r.wall_s,
        "waste_pct": 100 * r.waste_fraction,
        "waste_se_pct": 100 * r.waste_se / r.work_s,
        "rework_s": r.rework_s,
        "failures": r.failures,
        "value_lost_pct": 100 * r.value_lost,
        "vs_best_pct": 100 * (r.waste_s / best_waste - 1) if best_waste > 0 else 0.0,
    }


def _print_table(
    rows: list[dict[str, Any]], job: Job, failures: Failures, jobs: int, origin: str, plot: str | None
) -> None:
    dist = "exponential" if failures.shape == 1 else f"Weibull shape {failures.shape:g}"
    table = Table(
        title=f"{jobs} simulated jobs of {format_duration(job.work_s)} compute, MTBF "
        f"{format_duration(failures.mtbf_s)} ({dist}), stall {format_duration(job.stall_s)}, "
        f"persist {format_duration(job.persist_s)}, restart {format_duration(job.restart_s)}"
    )
    for col in ("policy", "interval", "ckpts", "mean wall", "waste", "vs best", "rework", "value lost"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        table.add_row(
            r["policy"],
            "varies" if r["interval_s"] is None else format_duration(r["interval_s"]),
            str(r["checkpoints"]),
            format_duration(r["wall_s"]),
            f"{r['waste_pct']:.2f}% ±{r['waste_se_pct']:.2f}",
            f"{r['vs_best_pct']:+.1f}%",
            format_duration(r["rework_s"]),
            f"{r['value_lost_pct']:.3f}%",
        )
    console = Console(width=140)
    console.print(table)
    console.print(f"value lost: share of the loss decrease to redo ({origin}); waste: (wall - compute) / compute")
    if plot:
        console.print(f"plot written to {plot}")


def _plot(path: str, search: Any, rows: list[dict[str, Any]], failures: Failures, origin: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'autockpt[plot]' (or pass --plot '')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    taus = [tau for tau, _ in search.sweep]
    left.plot(taus, [100 * r.waste_fraction for _, r in search.sweep], "-", color="0.5", label="uniform interval")
    for r in rows:
        if r["interval_s"] is not None:
            left.plot(r["interval_s"], r["waste_pct"], "o", label=r["policy"])
        else:  # a varying schedule: plotted at its mean interval
            mean = search.best.work_s / (r["checkpoints"] + 1)
            left.plot(mean, r["waste_pct"], "x", markersize=9, label=f"{r['policy']} (mean interval)")
    left.set_xscale("log")
    left.set_xlabel("checkpoint interval (s of compute)")
    left.set_ylabel("expected waste (% of compute)")
    left.set_title(f"waste vs interval, MTBF {format_duration(failures.mtbf_s)}")
    left.legend(fontsize=7)
    right.barh([r["policy"] for r in rows], [r["value_lost_pct"] for r in rows], color="tab:blue")
    right.set_xscale("log")
    right.set_xlabel(f"value lost (% of loss decrease, {origin}; log scale)")
    right.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
