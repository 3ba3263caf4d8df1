"""``autockpt goodput``: wall time to finish a job that really fails, per checkpointing method.

Per framework: a fixed amount of training (``--work`` seconds of compute, cut into
``--epochs`` epochs) runs as a real worker process (:mod:`.study.protocol`, ``goodput`` case)
that is SIGKILLed at seeded exponential times with mean ``--mtbf`` and rerun until it finishes
(:mod:`.study.kill_loop`); every method meets the same kill times. A failure history is one seed,
and only seeds whose first kill falls while the job trains are used
(:func:`.study.failures.history_seeds`), so every history has a failure to judge. Methods: the framework's
own per-epoch checkpointing resumed its users' way, a sweep of fixed every-N intervals (autockpt's
writer at a fixed interval: only the interval differs), autockpt with its overhead budget alone,
and autockpt told the MTBF (plus, in full runs, native every-N checkpointing at one N). With
``--notice``, each kill is announced by a SIGTERM that long before it (:mod:`.study.kill_loop`):
what a method that acts on a notice saves against one that only checkpoints on its schedule.
Beside
each measured figure the simulator's prediction for the same measured costs
(:mod:`.study.goodput_report`). Writes ``DIR/goodput.json``, ``DIR/goodput.md`` and
``DIR/goodput.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import shutil
import statistics
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from autockpt_core.cli.args import budget, duration

from .bench import machine_info
from .compare import _versions
from .study import goodput_report, plots
from .study.failures import history_seeds, kill_gaps
from .study.kill_loop import run_until_done
from .study.protocol import WORKERS, read_events, write_json, write_spec
from .study.run_progress import RunProgress
from .study.runner import command, compile_packages, worker_env
from .study.workloads import Workload, preset

HELP = "SIGKILL real training processes at seeded exponential times and measure the wall time to finish per method"

KILL_BEFORE = 0.75
"""A history's first kill falls within this share of the reference's training time: a method
that trains faster than the first reference run still meets it."""

KINDS = {"every-epoch": "every_epoch", "native-every-n": "native_every_n", "autockpt": "every_n",
         "autockpt-budget": "autockpt", "autockpt-mtbf": "autockpt_mtbf"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a short job and fewer methods (about 4.5 minutes per framework on a 2-core machine)")
    parser.add_argument("--framework", choices=sorted(WORKERS), default=None, help="one framework (default: both)")
    parser.add_argument("--mtbf", default=None, help="mean time between failures (default 30s; quick 10s)")
    parser.add_argument("--work", default=None, help="failure-free compute time of the job (default 60s; quick 20s)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs the job is cut into (default 4; quick 3)")
    parser.add_argument("--workload", default=None, help="small, medium or large (default small)")
    parser.add_argument("--sweep", default=None,
                        help="fixed intervals in steps, e.g. 10,20,40 (default: 1/16, 1/8, 1/4, 1/2 of an epoch; quick 1/8, 1/2)")
    parser.add_argument("--budget", default="2%", help="autockpt's overhead budget (default 2%%)")
    parser.add_argument("--methods", default="", help="only these method kinds, e.g. every_epoch,autockpt")
    parser.add_argument("--seed", type=int, default=0,
                        help="first seed of the kill times (default 0; seeds whose first kill misses the job are skipped)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="failure histories per method (seeds SEED, SEED+1, ...); medians and min–max shown")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--max-factor", type=float, default=8.0, help="give a method up after this × the failure-free time")
    parser.add_argument("--jobs", type=int, default=20_000, help="simulated jobs for the expected prediction")
    parser.add_argument("--notice", default=None,
                        help="announce each kill: SIGTERM this long before it (a preemption notice; default none)")
    parser.add_argument("--keras-backend", default="tensorflow", help="KERAS_BACKEND of the Keras runs")
    parser.add_argument("--out", default="autockpt-goodput", help="directory for goodput.json, goodput.md, goodput.png (default autockpt-goodput)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG")


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(args.quick)
    s: dict[str, Any] = {
        "quick": quick,
        "mtbf_s": duration("--mtbf", args.mtbf or ("10s" if quick else "30s")),
        "work_s": duration("--work", args.work or ("20s" if quick else "60s")),
        "epochs": args.epochs or (3 if quick else 4),
        "workload": args.workload or "small",
        "budget": budget("--budget", args.budget),
        "seed": args.seed,
        "threads": args.threads,
        "keras_backend": args.keras_backend,
        "max_factor": args.max_factor,
        "jobs": args.jobs,
        "native_every_n": not quick,
        "repeats": args.repeats,
        "notice_s": duration("--notice", args.notice) if args.notice else 0.0,
    }
    if s["epochs"] < 1 or args.max_factor <= 1 or args.jobs < 1 or args.repeats < 1:
        raise ValueError("--epochs, --repeats and --jobs must be >= 1, --max-factor > 1")
    workloads = preset(quick)
    if s["workload"] not in workloads:
        raise ValueError(f"--workload: {s['workload']!r} is not one of {', '.join(workloads)}")
    if args.sweep:
        try:
            s["sweep"] = sorted({int(x) for x in args.sweep.split(",") if x.strip()})
        except ValueError:
            raise ValueError(f"--sweep needs step counts, e.g. 10,20,40; got {args.sweep!r}") from None
        if not s["sweep"] or min(s["sweep"]) < 1:
            raise ValueError(f"--sweep needs positive step counts, got {args.sweep!r}")
    else:
        s["sweep"] = None
    s["only"] = {x.strip() for x in args.methods.split(",") if x.strip()}
    return s


def sweep_for(steps_per_epoch: int, quick: bool) -> list[int]:
    fractions = (8, 2) if quick else (16, 8, 4, 2)
    return sorted({max(1, round(steps_per_epoch / f)) for f in fractions})


def plan_methods(settings: dict[str, Any], steps_per_epoch: int) -> list[dict[str, Any]]:
    sweep = settings["sweep"] or sweep_for(steps_per_epoch, settings["quick"])
    methods: list[dict[str, Any]] = [{"name": "every-epoch"}]
    if settings["native_every_n"]:
        methods.append({"name": "native-every-n", "every": sweep[len(sweep) // 2]})
    methods += [{"name": "autockpt", "every": n} for n in sweep]
    methods += [{"name": "autockpt-budget", "budget": settings["budget"]},
                {"name": "autockpt-mtbf", "budget": settings["budget"], "mtbf_s": settings["mtbf_s"]}]
    return [m for m in methods if not settings["only"] or KINDS[m["name"]] in settings["only"]]


def method_label(method: dict[str, Any]) -> str:
    name = method["name"]
    return {
        "every-epoch": "native, every epoch",
        "native-every-n": f"native, every {method.get('every')} steps",
        "autockpt": f"fixed every {method.get('every')} steps",
        "autockpt-budget": f"autockpt ({method.get('budget', 0) * 100:g}% budget, no tuning)",
        "autockpt-mtbf": f"autockpt told the MTBF ({method.get('mtbf_s', 0):g} s)",
    }.get(name, name)


def run(args: argparse.Namespace, workers: dict[str, str] | None = None) -> int:
    settings = settings_from_args(args)
    frameworks = [args.framework] if args.framework else sorted(WORKERS)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    console = Console(width=200)
    compile_packages()
    started = time.perf_counter()
    runs = [_framework_run(f, settings, out, console, workers) for f in frameworks]
    header = {"machine": machine_info(), "date": dt.datetime.now().isoformat(timespec="seconds"),
              "command": "autockpt goodput " + " ".join(_argv(args)), "versions": _versions(),
              "wall_s": time.perf_counter() - started}
    for r in runs:
        r.update(header)
    result: Any = runs[0] if len(runs) == 1 else {"runs": runs, **header}
    write_json(os.path.join(out, "goodput.json"), result)
    plot = None
    if not args.no_plots:
        plot = "goodput.png"
        plots.goodput_per_method(runs, os.path.join(out, plot))
    with open(os.path.join(out, "goodput.md"), "w", encoding="utf-8") as f:
        f.write(markdown(runs, header, plot))
    for r in runs:
        _print(r, console)
    console.print(f"wrote {out}/goodput.json, goodput.md" + (f", {plot}" if plot else "")
                  + f"; wall time {header['wall_s']:.0f} s")
    return 0


def _spawn_fields(settings: dict[str, Any], directory: str, log: str, steps: int) -> dict[str, Any]:
    return {"dir": directory, "log": log, "steps": steps, "warmup": 0, "threads": settings["threads"],
            "keras_backend": settings["keras_backend"], "out": os.path.join(os.path.dirname(log), "unused.json"),
            "notice_s": settings.get("notice_s", 0.0)}  # with notices, autockpt listens for SIGTERM


def _run_method(framework: str, workload: Workload, method: dict[str, Any], steps: int, settings: dict[str, Any],
                work: str, gaps: Any, max_wall_s: float, workers: dict[str, str] | None,
                history: str = "") -> tuple[list[Any], bool, list[dict[str, Any]], str]:
    name = method["name"] + (f"-{method['every']}" if "every" in method else "")
    mdir = os.path.join(work, name)
    shutil.rmtree(mdir, ignore_errors=True)
    os.makedirs(mdir)
    spec, log = os.path.join(mdir, "spec.json"), os.path.join(mdir, "events.jsonl")
    output = os.path.join(work, f"{name}{history}.log")  # outside the method's directory: kept per history
    if os.path.exists(output):
        os.remove(output)
    write_spec(spec, workload, method, **_spawn_fields(settings, os.path.join(mdir, "ckpt"), log, steps))
    attempts, finished = run_until_done(command(framework, "goodput", spec, workers),
                                        worker_env(settings["threads"], settings["keras_backend"]),
                                        gaps, output, max_attempts=1000, max_wall_s=max_wall_s,
                                        notice_s=settings.get("notice_s", 0.0),
                                        done=lambda: any(e["event"] == "done" for e in read_events(log)))
    return attempts, finished, read_events(log), output


def _framework_run(framework: str, settings: dict[str, Any], out: str, console: Console,
                   workers: dict[str, str] | None) -> dict[str, Any]:
    work = os.path.join(out, f"runs-{framework}")
    base = preset(settings["quick"])[settings["workload"]]
    never = iter(lambda: 1e9, None)  # no kills
    # 1. calibrate the step time on a short uninterrupted run without checkpoints
    calib_steps = 30
    attempts, finished, events, output = _run_method(framework, base, {"name": "none"}, calib_steps, settings,
                                                     os.path.join(work, "calibrate"), never, 1e9, workers)
    if not finished:
        raise RuntimeError(f"{framework}: the calibration run failed; see {output}")
    step_s, _ = goodput_report.compute_rate(events)
    per_epoch = max(4, round(settings["work_s"] / settings["epochs"] / step_s))
    workload = dataclasses.replace(base, steps_per_epoch=per_epoch)
    steps = per_epoch * settings["epochs"]
    methods = plan_methods(settings, per_epoch)
    reps = settings["repeats"]
    with RunProgress(console, (len(methods) + 1) * reps + 1, f"{framework}: goodput") as progress:
        # 2. rounds: the failure-free reference (the whole job, no checkpoints, no kills), then every
        #    method once with the round's failure history; the reference once more at the end. So the
        #    reference runs between the killed attempts and the machine's drift shows as its spread.
        free: list[float] = []
        timing: list[tuple[float, float]] = []

        def reference() -> None:
            attempts, finished, events, output = _run_method(framework, workload, {"name": "none"}, steps, settings,
                                                             work, never, 1e9, workers)
            if not finished:
                raise RuntimeError(f"{framework}: the failure-free run failed; see {output}")
            free.append(attempts[0].wall_s)
            timing.append(goodput_report.compute_rate(events))
            progress.done()

        raw: list[list[dict[str, Any]]] = [[] for _ in methods]
        seeds: list[int] = []
        for rep in range(reps):
            progress.start(f"{framework}: failure-free reference")
            reference()
            if not seeds:  # histories whose first kill falls after the startup, well before the job's end
                startup = timing[0][1]
                seeds = history_seeds(settings["mtbf_s"], settings["seed"], reps, after_s=startup,
                                      before_s=startup + KILL_BEFORE * (free[0] - startup))
            gaps_seed = seeds[rep]
            for per_seed, method in zip(raw, methods):
                progress.start(f"{framework}: {method_label(method)}, history {rep + 1}/{reps}")
                attempts, finished, events, output = _run_method(
                    framework, workload, method, steps, settings, work, kill_gaps(settings["mtbf_s"], gaps_seed),
                    settings["max_factor"] * free[0], workers, history=f"-seed{gaps_seed}")
                acc = goodput_report.account(attempts, events, steps)
                acc["finished"] = acc["finished"] and finished
                acc["seed"] = gaps_seed
                if not acc["finished"]:
                    acc["note"] = (f"did not finish within {settings['max_factor']:g}× the failure-free time"
                                   if attempts and attempts[-1].killed else f"worker failed; see {output}")
                per_seed.append(acc)
                progress.done()
        progress.start(f"{framework}: failure-free reference again")
        reference()
    failure_free_s = statistics.median(free)
    step_s = statistics.median(t[0] for t in timing)
    startup_s = statistics.median(t[1] for t in timing)
    rows = []
    for method, per_seed in zip(methods, raw):
        for acc in per_seed:
            acc["slowdown_factor"] = acc["wall_s"] / failure_free_s
            if acc["checkpoints"] or acc["finished"]:
                acc["predicted"] = goodput_report.predict(
                    acc, steps=steps, step_s=step_s, startup_s=startup_s, failure_free_s=failure_free_s,
                    mtbf_s=settings["mtbf_s"], seed=acc["seed"], jobs=settings["jobs"])
        rows.append({"name": method_label(method), "kind": KINDS[method["name"]], "method": method,
                     **goodput_report.combine(per_seed, failure_free_s)})
    kills = kill_gaps(settings["mtbf_s"], seeds[0])
    result = {
        "framework": framework, "mtbf_s": settings["mtbf_s"], "failure_free_s": failure_free_s,
        "failure_free_runs_s": free,
        "workload": {"description": workload.describe(), **workload.to_json()}, "steps": steps, "epochs": settings["epochs"],
        "step_s": step_s, "startup_s": startup_s, "seed": seeds[0], "history_seeds": seeds,
        "kill_times_s": [round(next(kills), 3) for _ in range(max((a["attempts"] for r in raw for a in r), default=0))],
        "settings": {k: v for k, v in settings.items() if k != "only"} | {"only": sorted(settings["only"])},
        "methods": rows,
    }
    result["targets"] = targets(rows)
    if all(r["finished"] for r in rows):
        shutil.rmtree(work, ignore_errors=True)
    return result


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Within 5% of the best fixed every-N (wall), and ≥ 30% less waste than per-epoch.

    Checked twice: on the measured wall times (one failure history per seed, on a shared machine)
    and on the simulator's expectation for each method's measured costs (many histories). A
    measured comparison where either side met no failure is not judged (``met`` None): it says
    which process happened to finish first, not what its checkpoints saved.
    """
    out = []
    for basis in ("measured", "expected"):
        def wall(r: dict[str, Any]) -> float | None:
            if basis == "measured":
                return r["wall_s"] if r["finished"] else None
            return (r.get("predicted") or {}).get("expected", {}).get("wall_s")

        def waste(r: dict[str, Any]) -> float | None:
            if basis == "measured":
                return r["waste_s"]
            p = r.get("predicted")
            return p["expected"]["wall_s"] - p["inputs"]["work_s"] - p["inputs"]["restart_s"] if p else None

        fixed = [r for r in rows if r["kind"] == "every_n" and wall(r) is not None]
        epoch = next((r for r in rows if r["kind"] == "every_epoch" and waste(r) is not None), None)
        label = "measured" if basis == "measured" else "simulator, measured costs"
        def unfailed(*compared: dict[str, Any]) -> bool:
            return basis == "measured" and any(not x.get("kills") for x in compared)

        for r in rows:
            if r["kind"] not in ("autockpt", "autockpt_mtbf") or wall(r) is None:
                continue
            if fixed:
                best = min(fixed, key=lambda x: wall(x))  # type: ignore[arg-type, return-value]
                target = f"wall ≤ 1.05× best fixed ({best['name']})"
                if unfailed(r, best):
                    out.append(_no_failure(r["name"], label, target))
                else:
                    ratio = wall(r) / wall(best)  # type: ignore[operator]
                    out.append({"method": r["name"], "basis": label, "target": target,
                                "measured": f"{ratio:.3f}×", "met": ratio <= 1.05})
            if epoch and unfailed(r, epoch):
                out.append(_no_failure(r["name"], label, "waste ≥ 30% below per-epoch"))
            elif epoch and (waste(epoch) or 0) > 0:
                cut = 1 - waste(r) / waste(epoch)  # type: ignore[operator]
                out.append({"method": r["name"], "basis": label, "target": "waste ≥ 30% below per-epoch",
                            "measured": f"{cut * 100:.0f}% less" + ("" if epoch["finished"] else " (per-epoch did not finish)"),
                            "met": cut >= 0.30})
    return out


def _no_failure(method: str, basis: str, target: str) -> dict[str, Any]:
    return {"method": method, "basis": basis, "target": target,
            "measured": "no failure happened (median kills 0): not judged", "met": None}


def _verdict(met: bool | None) -> str:
    return "no verdict" if met is None else "met" if met else "NOT met"


HEAD = ["method", "wall s", "÷ failure-free", "simulated (same kills / expected)", "kills", "steps redone",
        "restart s", "checkpoints", "blocked ms", "persist s"]


def _table(run: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in run["methods"]:
        p = r.get("predicted") or {}
        sim = (f"{p['replay']['slowdown_factor']:.2f} / {p['expected']['slowdown_factor']:.2f}" if p else "-")
        rows.append([
            r["name"] + ("" if r["finished"] else " (unfinished)"),
            f"{r['wall_s']:.1f}" + (f" ({r['wall_spread_s'][0]:.0f}…{r['wall_spread_s'][1]:.0f})" if r.get("wall_spread_s") else ""),
            f"{r['slowdown_factor']:.2f}", sim, f"{r['kills']:g}", f"{r['steps_redone']:g}", "-" if r["restart_s"] is None else f"{r['restart_s']:.1f}",
            f"{r['checkpoints']:g}", "-" if r["blocked_ms"] is None else f"{r['blocked_ms']:.1f}",
            "-" if r.get("persist_s") is None else f"{r['persist_s']:.2f}",
        ])
    return rows


def _title(run: dict[str, Any]) -> str:
    return (f"{run['framework']}: {run['workload']['description']}; job {run['steps']} steps "
            f"({run['epochs']} epochs, {run['step_s'] * 1e3:.1f} ms/step), failure-free {run['failure_free_s']:.1f} s "
            f"(startup {run['startup_s']:.1f} s); MTBF {run['mtbf_s']:g} s, "
            f"seed{'s' if len(run.get('history_seeds', [])) > 1 else ''} {', '.join(map(str, run.get('history_seeds') or [run['seed']]))}"
            + (f", {run['settings']['repeats']} failure histories (medians)" if run["settings"]["repeats"] > 1 else "")
            + (f"; each kill announced by SIGTERM {notice:g} s before it" if (notice := run["settings"].get("notice_s")) else ""))


def _print(run: dict[str, Any], console: Console) -> None:
    table = Table(title=_title(run))
    for col in HEAD:
        table.add_column(col, justify="left" if col == "method" else "right")
    for row in _table(run):
        table.add_row(*row)
    console.print(table)
    for t in run["targets"]:
        console.print(f"{_verdict(t['met'])} ({t['basis']}): {t['method']}: {t['target']} — {t['measured']}")


def markdown(runs: list[dict[str, Any]], header: dict[str, Any], plot: str | None) -> str:
    m = header["machine"]
    lines = ["# autockpt goodput: jobs that really fail", "",
             f"Machine: {m['description']}. Date {header['date']}. Command `{header['command']}` "
             f"(wall time {header['wall_s']:.0f} s).", ""]
    for run in runs:
        lines += [f"## {_title(run)}", "", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
        lines += ["| " + " | ".join(r) + " |" for r in _table(run)]
        lines += ["", f"Kill times of seed {run['seed']} (s after each process start): {', '.join(f'{k:g}' for k in run['kill_times_s'])}.", ""]
        if run["targets"]:
            lines += ["| method | target | basis | result | met |", "|---|---|---|---|---|"]
            lines += [f"| {t['method']} | {t['target']} | {t['basis']} | {t['measured']} | {'-' if t['met'] is None else 'yes' if t['met'] else 'no'} |"
                      for t in run["targets"]]
            lines.append("")
    if plot:
        lines.append(f"![{plot}]({plot})")
    return "\n".join(lines) + "\n"


def _argv(args: argparse.Namespace) -> list[str]:
    out = ["--quick"] if args.quick else []
    for name in ("framework", "mtbf", "work", "epochs", "workload", "sweep", "methods", "seed", "repeats", "notice"):
        value = getattr(args, name)
        if value not in (None, ""):
            out += [f"--{name}", str(value)]
    return out + ["--out", args.out]

