"""Benchmark of the policy engine: ``python examples/policy_benchmark.py [--out bench-out/policy.json]``.

Prints tables and writes every number to JSON (the source of the results in docs/policy.md):

1. Daly's worked values.
2. Simulator throughput (100,000 jobs).
3. autockpt's interval vs the brute-force best uniform interval over (stall, MTBF, iteration).
4. Front-loaded vs uniform Young at equal checkpoint count, offline (recorded curve) and online
   (the runtime fitting the loss as it trains), for several decay depths β.
5. All policies on one job (exponential and Weibull failures).
6. Adaptive re-tuning on a fake clock: drift scenarios and iteration jitter.

Everything is seeded; only the timings vary between runs. Takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from autockpt_core import Config, Estimates, choose_interval, daly_interval, young_interval
from autockpt_core.policy.adaptive import AdaptiveTuner
from autockpt_core.policy.adjusters import adjusters_from_config
from autockpt_core.policy.dryrun import Scenario, constant, dry_run, switch
from autockpt_core.policy.frontload import MAX_STRETCH, ValueModel, equal_count_steps, schedule_steps
from autockpt_core.policy.losscurve import LossCurve, fit_loss_curve
from autockpt_core.policy.simulate import Failures, Job, best_uniform_interval, simulate, uniform_positions

HOUR, MIN = 3600.0, 60.0
console = Console(width=150)


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    t = Table(title=title)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in r])
    console.print(t)


def daly_values() -> list[dict[str, float]]:
    out = [
        {"mtbf_h": m / HOUR, "daly_min": daly_interval(5 * MIN, m) / MIN, "young_min": young_interval(5 * MIN, m) / MIN}
        for m in (24 * HOUR, 6 * HOUR, 15 * MIN)
    ]
    table("Daly eq. 37, delta = 5 min (paper: 117, 57, 9.1 min)", ["MTBF h", "Daly min", "Young min"],
          [[r["mtbf_h"], r["daly_min"], r["young_min"]] for r in out])
    return out


def throughput() -> dict[str, float]:
    job, f = Job(48 * HOUR, 0.12, 2.0, 300.0), Failures(6 * HOUR)
    simulate(72.0, job, f, jobs=1000)  # warm-up
    t0 = time.perf_counter()
    r = simulate(72.0, job, f, jobs=100_000, seed=0)
    seconds = time.perf_counter() - t0
    out = {"jobs": 100_000, "seconds": seconds, "failures_per_job": r.failures, "checkpoints": r.planned_checkpoints}
    table("Simulator throughput (48 h job, MTBF 6 h, 72 s interval)", list(out), [list(out.values())])
    return out


def grid() -> list[dict[str, float]]:
    rows = []
    for stall in (0.12, 2.0, 30.0):
        for mtbf in (15 * MIN, 6 * HOUR, 24 * HOUR):
            for it in (0.05, 0.35, 2.0):
                cfg = Config(dirpath="x", overhead_budget=0.5, mtbf=mtbf)
                est = Estimates(iter_time_s=it, stall_s=stall, persist_s=min(2.0, 5 * stall))
                choice = choose_interval(cfg, est)
                job = Job(10 * mtbf, stall, float(est.persist_s), min(300.0, mtbf / 10))  # type: ignore[arg-type]
                search = best_uniform_interval(job, Failures(mtbf), jobs=20_000, seed=1)
                r = simulate(choice.seconds, job, Failures(mtbf), jobs=20_000, seed=1)
                rows.append({
                    "stall_s": stall, "mtbf_s": mtbf, "iter_s": it, "chosen_s": choice.seconds, "rule": choice.rule,
                    "best_s": search.best_s, "waste_pct": 100 * r.waste_fraction,
                    "best_waste_pct": 100 * search.best.waste_fraction,
                    "gap_pct": 100 * (r.waste_s / search.best.waste_s - 1),
                })
    table("autockpt interval vs brute-force best uniform interval (20,000 jobs each, common random numbers)",
          ["stall s", "MTBF h", "iter s", "chosen s", "best s", "waste %", "best waste %", "gap %"],
          [[r["stall_s"], r["mtbf_s"] / HOUR, r["iter_s"], r["chosen_s"], r["best_s"], r["waste_pct"],
            r["best_waste_pct"], r["gap_pct"]] for r in rows])
    return rows


def front_loaded() -> list[dict[str, float]]:
    steps, t, stall, mtbf, persist, restart = 20_000, 1.0, 2.0, HOUR, 10.0, 60.0
    job, f = Job(steps * t, stall, persist, restart), Failures(mtbf)
    rows = []
    for beta in (2.0, 3.0, 4.6, 6.0, 8.0):
        true = LossCurve(rate=-beta / steps, log_scale=math.log(2.0), floor=0.3)
        model = ValueModel(true, steps)
        value = lambda p, m=model: m.cumulative(p / t)  # noqa: E731
        sim = lambda pos, v=value: simulate(pos, job, f, jobs=50_000, seed=5, value=v)  # noqa: E731
        # offline: schedule from a noisy recorded curve, as many checkpoints as uniform Young
        k = np.arange(0, steps, 5.0)
        fit = fit_loss_curve(k, true.loss(k) * (1 + 0.05 * np.random.default_rng(1).standard_normal(k.size)))
        young = uniform_positions(young_interval(stall, mtbf), job.work_s)
        front = equal_count_steps(ValueModel(fit.curve, steps), young.size) * t  # type: ignore[arg-type]
        u, fr = sim(young), sim(front)
        # online: the policy fits the loss while training (10% noise), runtime clamps included
        noise = 1 + 0.1 * np.random.default_rng(2).standard_normal(steps + 1)
        scen = Scenario(iter_time=constant(t), stall=constant(stall), persist=constant(persist),
                        loss=lambda s, c=true, n=noise: float(c.loss(s) * n[s]))
        cfg = Config(dirpath="x", mtbf=mtbf, overhead_budget=0.05, schedule="front_loaded", total_steps=steps,
                     adaptive=False)
        online = np.array([c.step for c in dry_run(cfg, scen, steps, adjusters_from_config(cfg)).checkpoints]) * t
        uo, on = sim(np.linspace(0, job.work_s, online.size + 2)[1:-1]), sim(online)
        rows.append({
            "beta": beta, "loss_drop_x": (2.3 / (0.3 + 2 * math.exp(-beta))), "checkpoints": young.size,
            "theory_reduction_pct": 100 * (1 - 4 / beta * math.tanh(beta / 4)),
            "offline_reduction_pct": 100 * (1 - fr.value_lost / u.value_lost),
            "online_checkpoints": online.size, "online_reduction_pct": 100 * (1 - on.value_lost / uo.value_lost),
            "uniform_waste_pct": 100 * u.waste_fraction, "front_waste_pct": 100 * fr.waste_fraction,
            "online_waste_pct": 100 * on.waste_fraction, "online_uniform_waste_pct": 100 * uo.waste_fraction,
        })
    table("Front-loaded vs uniform at equal checkpoint count: value-weighted lost progress (50,000 jobs)",
          ["beta", "loss drop x", "ckpts", "theory -%", "offline -%", "online ckpts", "online -%",
           "waste % unif", "waste % front", "waste % online", "waste % unif(online n)"],
          [[r["beta"], r["loss_drop_x"], r["checkpoints"], r["theory_reduction_pct"], r["offline_reduction_pct"],
            r["online_checkpoints"], r["online_reduction_pct"], r["uniform_waste_pct"], r["front_waste_pct"],
            r["online_waste_pct"], r["online_uniform_waste_pct"]] for r in rows])
    return rows


def policies(shape: float) -> list[dict[str, Any]]:
    t, stall, persist, mtbf, work = 0.35, 0.12, 2.0, 6 * HOUR, 48 * HOUR
    cfg = Config(dirpath="x", overhead_budget=0.02, mtbf=mtbf)
    est = Estimates(iter_time_s=t, stall_s=stall, persist_s=persist)
    choice = choose_interval(cfg, est)
    checkfreq = choose_interval(cfg.replace(mtbf=None), est)
    horizon = work / t
    model = ValueModel(LossCurve(rate=math.log(0.01) / horizon, log_scale=0.0, floor=0.0), horizon)
    c = choice.candidates
    front = np.array(schedule_steps(model, c["daly"], max(c["budget"], c["persist"]), math.inf, MAX_STRETCH)) * t
    schedules: dict[str, Any] = {
        "every epoch (1 h)": HOUR, "every 1000 steps": 1000 * t, "CheckFreq budget": checkfreq.seconds,
        "Young": young_interval(stall, mtbf), "Daly": daly_interval(stall, mtbf),
        "front-loaded": front[front < work], f"autockpt ({choice.rule})": choice.seconds,
    }
    job, f = Job(work, stall, persist, 300.0), Failures(mtbf, shape)
    value = lambda p: model.cumulative(p / t)  # noqa: E731
    results = {n: simulate(s, job, f, jobs=100_000, seed=0, value=value) for n, s in schedules.items()}
    search = best_uniform_interval(job, f, jobs=100_000, seed=0, value=value, points=17, refine=5)
    results["best uniform (brute force)"] = search.best
    schedules["best uniform (brute force)"] = search.best_s
    rows = [{
        "policy": n, "interval_s": float(schedules[n]) if np.ndim(schedules[n]) == 0 else None,
        "checkpoints": r.planned_checkpoints, "waste_pct": 100 * r.waste_fraction,
        "value_lost_pct": 100 * r.value_lost, "failures": r.failures,
    } for n, r in results.items()]
    dist = "exponential" if shape == 1 else f"Weibull shape {shape}"
    table(f"Policies, 48 h job, iter 350 ms, stall 120 ms, persist 2 s, MTBF 6 h ({dist}), restart 5 min, 100,000 jobs",
          ["policy", "interval s", "ckpts", "waste %", "value lost %"],
          [[r["policy"], "varies" if r["interval_s"] is None else r["interval_s"], r["checkpoints"],
            r["waste_pct"], r["value_lost_pct"]] for r in rows])
    return rows


def adaptive() -> list[dict[str, Any]]:
    mid, steps, budget = 4000, 9000, 0.02
    cfg = Config(dirpath="x", overhead_budget=budget)
    cases = {
        "iteration time doubles": Scenario(iter_time=switch(mid, 0.1, 0.2)),
        "iterations near checkpoint work 2x slower": Scenario(persist=constant(1.0), slowdown=switch(mid, 0.0, 1.0)),
        "stall doubles": Scenario(stall=switch(mid, 0.05, 0.1)),
        "stall halves": Scenario(stall=switch(mid, 0.1, 0.05)),
    }
    rows = []
    for name, scen in cases.items():
        out: dict[str, Any] = {"scenario": name}
        for label, adjusters in (("tuned", [AdaptiveTuner(cfg)]), ("static", [])):
            tr = dry_run(cfg, scen, steps, adjusters)
            ck = [c for c in tr.checkpoints if c.interval_steps is not None]
            i0 = next(i for i, c in enumerate(ck) if c.step > mid)
            final = ck[-1].interval_steps
            settle = next(j for j in range(i0, len(ck)) if all(c.interval_steps == final for c in ck[j:])) - i0
            out[label] = {
                "interval_before": ck[i0 - 1].interval_steps, "interval_after": final, "checkpoints_to_settle": settle,
                "overhead_before_pct": 100 * tr.overhead(1000, mid - 1),
                "overhead_transition_pct": 100 * tr.overhead(mid, mid + 1500),
                "overhead_after_pct": 100 * tr.overhead(mid + 1500, steps),
                "changes": len(adjusters[0].changes) if adjusters else 0,
            }
        rows.append(out)
    jitter_rows = []
    for sd in (0.05, 0.2, 0.5):
        jit = np.clip(1 + sd * np.random.default_rng(0).standard_normal(40_001), 0.2, None)
        tuner = AdaptiveTuner(cfg)
        scen = Scenario(iter_time=lambda k, j=jit: 0.1 * j[k], persist=constant(0.5), slowdown=constant(0.3))
        tr = dry_run(cfg, scen, 40_000, [tuner])
        turns = sum(a.direction != b.direction for a, b in zip(tuner.changes, tuner.changes[1:]))
        jitter_rows.append({"jitter_sd": sd, "checkpoints": len(tr.checkpoints), "changes": len(tuner.changes),
                            "reversals": turns, "overhead_pct": 100 * tr.overhead(2000, 40_000)})
    table("Adaptive re-tuning on a fake clock (budget 2%, drift at step 4000 of 9000)",
          ["scenario", "mode", "interval before", "after", "ckpts to settle", "ovh before %", "ovh steps 4000-5500 %",
           "ovh after %", "changes"],
          [[r["scenario"], m, r[m]["interval_before"], r[m]["interval_after"], r[m]["checkpoints_to_settle"],
            r[m]["overhead_before_pct"], r[m]["overhead_transition_pct"], r[m]["overhead_after_pct"], r[m]["changes"]]
           for r in rows for m in ("tuned", "static")])
    table("Adaptive re-tuning under iteration-time jitter (40,000 steps, constant true cost)",
          list(jitter_rows[0]), [list(r.values()) for r in jitter_rows])
    return rows + [{"jitter": jitter_rows}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/policy.json")
    args = parser.parse_args()
    t0 = time.perf_counter()
    result = {
        "machine": {"description": "2-core CPU dev machine", "cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "numpy": np.__version__},
        "daly": daly_values(),
        "throughput": throughput(),
        "grid": grid(),
        "front_loaded": front_loaded(),
        "policies_exponential": policies(1.0),
        "policies_weibull_0.7": policies(0.7),
        "adaptive": adaptive(),
    }
    result["runtime_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    console.print(f"wrote {out} in {result['runtime_s']:.0f}s")


if __name__ == "__main__":
    main()
