"""``autockpt compare``: what checkpointing costs in PyTorch/Lightning and TensorFlow/Keras.

The same small/medium/large workloads (:mod:`.study.workloads`) are trained in both frameworks
with no checkpointing, autockpt at a fixed interval and under overhead budgets, and each
framework's own checkpointing at the same interval. Every run is a fresh worker process
(:mod:`.study.protocol`); after each run with checkpoints a second process resumes from its
newest checkpoint and trains to the end, which gives the restore time and whether the resumed
run is exact. Repetitions alternate the order of the methods.

Each run is recorded in ``DIR/runs.jsonl`` as it finishes (:mod:`.study.run_log`); a rerun with
the same ``--out`` reuses the runs recorded with the same settings, measures the rest (failed
runs again) and goes on where an interrupted one stopped; ``--fresh`` starts over. At the end
``DIR/results.json``, ``DIR/results.md`` and three PNGs are written from all of this command's
runs, and the table printed. ``--quick`` (:data:`DEFAULTS`) is the small workload, every method,
one repetition: about 2 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import shutil
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from autockpt_core.cli.args import budget, duration

from .bench import machine_info
from .study import plots, report
from .study.in_process_ab import ab_block
from .study.protocol import KERAS_METHODS, LIGHTNING_METHODS, NATIVE_SYNC, WORKERS, write_json, write_text
from .study.run_log import FILE as RUN_LOG
from .study.run_log import RunLog, failed
from .study.run_progress import RunProgress
from .study.runner import compile_packages, run_case
from .study.workloads import Workload, preset

HELP = "measure checkpointing cost in Lightning and Keras on small/medium/large workloads, native vs autockpt"

FRAMEWORK_METHODS = {"lightning": LIGHTNING_METHODS, "keras": KERAS_METHODS}
FRAMEWORK_PACKAGES = ("torch", "lightning", "keras", "tensorflow", "orbax-checkpoint", "jax")

#: flag -> (the full study's default, ``--quick``'s default); the help quotes both. Quick is the
#: scaled-down small workload only, one repetition, no in-process A/B (a budget run of 6 s chooses
#: an interval of hundreds of steps, which two cycles cannot tell from noise).
DEFAULTS: dict[str, tuple[Any, Any]] = {
    "workloads": ("small,medium,large", "small"), "every": (10, 5), "checkpoints": (4, 3), "warmup": (5, 3),
    "budgets": ("1%,2%,5%", "2%"), "budget_window": ("60s", "6s"), "ab_cycles": (4, 0), "repeats": (2, 1),
}
QUICK_HELP = ("the small workload (scaled down), every method, few steps, one repetition, no in-process A/B, "
              "restore runs for autockpt and the synchronous ModelCheckpoint only (about 2 minutes on a 2-core machine)")


def _defaults(flag: str) -> str:
    full, quick = DEFAULTS[flag]
    return f"default {full}; quick {quick}".replace("%", "%%")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help=QUICK_HELP)
    parser.add_argument("--out", default="autockpt-compare",
                        help=f"directory for results.json, results.md, the PNGs and {RUN_LOG}, the runs recorded as they "
                             "finish: the same command again reuses them and measures the rest (default autockpt-compare)")
    parser.add_argument("--fresh", action="store_true",
                        help=f"measure every run again: move --out's {RUN_LOG} to runs.old.jsonl and start a new one")
    parser.add_argument("--frameworks", default="lightning,keras", help="lightning, keras or both (default)")
    parser.add_argument("--workloads", default=None, help=f"which of small, medium, large ({_defaults('workloads')})")
    parser.add_argument("--methods", default="", help="only these methods (names as in results.json; default all)")
    parser.add_argument("--every", type=int, default=None, help=f"checkpoint interval k in steps ({_defaults('every')})")
    parser.add_argument("--checkpoints", type=int, default=None,
                        help=f"checkpoints per run at interval k ({_defaults('checkpoints')})")
    parser.add_argument("--warmup", type=int, default=None, help=f"steps excluded from step times ({_defaults('warmup')})")
    parser.add_argument("--budgets", default=None, help=f"overhead budgets of the budget runs ({_defaults('budgets')})")
    parser.add_argument("--budget-window", default=None,
                        help="training time of each budget run, so it can hold the interval autockpt chooses "
                             f"({_defaults('budget_window')}; never fewer steps than the fixed-interval runs)")
    parser.add_argument("--ab-cycles", type=int, default=None,
                        help="after each budget run, an in-process A/B of its final interval in this many cycles of "
                             f"on and off blocks ({_defaults('ab_cycles')}; 0 = none)")
    parser.add_argument("--repeats", type=int, default=None, help=f"repetitions ({_defaults('repeats')})")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of every run (default 1; 0 = framework default)")
    parser.add_argument("--no-restore", action="store_true", help="skip the restore runs")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    parser.add_argument("--keras-backend", default="tensorflow", help="KERAS_BACKEND of the Keras runs")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per worker process")
    parser.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                        help="measure nothing: merge the results.json of earlier runs (e.g. one per workload) into --out")


def _budgets(text: str) -> list[float]:
    return [budget("--budgets", part.strip()) for part in text.split(",") if part.strip()]


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(args.quick)

    def pick(flag: str) -> Any:  # the flag's value, else its default (full or quick)
        value = getattr(args, flag)
        return value if value is not None else DEFAULTS[flag][quick]

    s = {
        "quick": quick,
        "every": pick("every"),
        "checkpoints": pick("checkpoints"),
        "warmup": pick("warmup"),
        "budgets": _budgets(pick("budgets")),
        "repeats": pick("repeats"),
        "threads": args.threads,
        "keras_backend": args.keras_backend,
        "restore": not args.no_restore,
        "budget_window_s": duration("--budget-window", pick("budget_window")),
        "ab_cycles": pick("ab_cycles"),
    }
    if s["every"] < 2 or s["checkpoints"] < 1 or s["warmup"] < 1 or s["repeats"] < 1:
        raise ValueError("--every must be >= 2; --checkpoints, --warmup and --repeats >= 1")
    if s["ab_cycles"] < 0 or s["ab_cycles"] == 1:
        raise ValueError(f"--ab-cycles: {s['ab_cycles']} gives no noise figure; use 0 (no A/B) or at least 2")
    # checkpoints at global steps k, 2k, ..., Ck, then k/2 more steps (never a multiple of k) that a restore trains again
    s["steps"] = max(s["warmup"] + 1, s["checkpoints"] * s["every"] + max(1, s["every"] // 2))
    return s


def plan_methods(framework: str, settings: dict[str, Any], only: set[str]) -> list[dict[str, Any]]:
    methods: list[dict[str, Any]] = []
    for name in FRAMEWORK_METHODS[framework]:
        methods.append({"name": name} if name == "none" else {"name": name, "every": settings["every"]})
        if name == "autockpt":
            for b in settings["budgets"]:
                methods.append({"name": "autockpt-budget", "budget": b})
                if settings.get("ab_cycles"):  # its interval, measured in one process; run right after it
                    methods.append({"name": "autockpt-ab", "budget": b})
    if settings["budgets"]:  # the budget runs' own baseline: as long as they are (epoch ends, drift)
        methods.insert(1, {"name": "none", "long": True})
    def wanted(m: dict[str, Any]) -> bool:
        if m["name"] == "autockpt-ab":
            return wanted({"name": "autockpt-budget", "budget": m["budget"]})
        return not only or report.method_key(m) in only or m["name"] in only or m["name"] == "none"

    keep = [m for m in methods if wanted(m)]
    return keep if any(m["name"] == "autockpt-budget" for m in keep) else [m for m in keep if not m.get("long")]


def _list(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    wrong = [x for x in items if x not in allowed]
    if wrong or not items:
        raise ValueError(f"{flag}: unknown {wrong or text!r}; choose from {', '.join(allowed)}")
    return items


def run(args: argparse.Namespace, workers: dict[str, str] | None = None) -> int:
    if args.merge:
        return _merge(args)
    settings = settings_from_args(args)
    frameworks = _list(args.frameworks, tuple(WORKERS), "--frameworks")
    all_workloads = preset(settings["quick"])
    names = _list(args.workloads or DEFAULTS["workloads"][settings["quick"]], tuple(all_workloads), "--workloads")
    workloads = {name: all_workloads[name] for name in names}
    only = {x.strip() for x in args.methods.split(",") if x.strip()}
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    scratch = os.path.join(out, "runs")
    console = Console(width=200)
    compile_packages()
    started = time.perf_counter()
    plan = [(rep, f, w, m) for rep in range(settings["repeats"]) for f in frameworks for w in workloads
            for m in _ordered(plan_methods(f, settings, only), rep)]
    versions = _versions()
    runs: list[dict[str, Any]] = []
    step_s: dict[tuple[str, str], float] = {}  # (framework, workload) -> step time without checkpoints, first repetition
    with RunLog(os.path.join(out, RUN_LOG), fresh=args.fresh) as log, RunProgress(console, len(plan), "compare") as progress:
        try:
            for rep, framework, name, method in plan:
                steps = settings["steps"]
                if (method["name"] == "autockpt-budget" or method.get("long")) and (framework, name) in step_s:
                    steps = max(steps, settings["warmup"] + round(settings["budget_window_s"] / step_s[(framework, name)]))
                if method["name"] == "autockpt-ab":
                    method, steps = _ab_method(method, runs, rep, framework, name, settings)
                # after the steps and the A/B's interval, which come from earlier runs: a run measured again
                # (it had failed) changes what depends on it, and that is measured again too
                identity = _identity(framework, workloads[name], method, rep, steps, settings, workers, versions)
                run_ = log.reuse(identity)
                if run_ is None:
                    progress.start(f"rep {rep + 1} {framework} {name} {report.method_key(method)}")
                    run_started = time.perf_counter()
                    run_ = _measure(framework, workloads[name], method, rep, steps, settings, scratch, args.timeout, workers)
                    run_["wall_s"] = time.perf_counter() - run_started
                    log.append(identity, run_)
                    progress.done()
                else:
                    progress.skip()
                if method == {"name": "none"} and run_["train"].get("step_s") and (framework, name) not in step_s:
                    step_s[(framework, name)] = run_["train"]["step_s"]
                runs.append(run_)
        except KeyboardInterrupt:
            console.print(f"interrupted: {log.appended} run(s) of this command recorded in {log.path}; "
                          "the same command again reuses them and measures the rest")
            return 130
    results: dict[str, Any] = {
        "machine": machine_info(),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": "autockpt compare " + " ".join(_argv(args)),
        "versions": versions,
        "settings": settings,
        "frameworks": frameworks,
        "workloads": {n: {"description": w.describe(), "params": w.params, "state_bytes": w.state_bytes, **w.to_json()}
                      for n, w in workloads.items()},
        "runs": runs,
    }
    results["rows"] = report.summarize(runs)
    results["targets"] = report.targets(results["rows"])
    results["wall_s"] = time.perf_counter() - started  # this invocation's
    results["run_s"] = sum(r.get("wall_s", 0.0) for r in runs)  # the processes of all runs, reused ones too
    results["reused_runs"] = len(runs) - log.appended
    results["plots"] = [] if args.no_plots else _plots(results, out)
    if not any(failed(r) for r in runs):
        shutil.rmtree(scratch, ignore_errors=True)  # logs of failed runs stay for reading
    _write(results, out, console)
    return 0


def _merge(args: argparse.Namespace) -> int:
    parts = []
    for directory in args.merge:
        path = os.path.join(directory, "results.json")
        if not os.path.isfile(path):
            raise ValueError(f"--merge: no results.json in {directory}")
        with open(path, encoding="utf-8") as f:
            parts.append(json.load(f))
    results = report.merge(parts)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    results["plots"] = [] if args.no_plots else _plots(results, out)
    _write(results, out, Console(width=200))
    return 0


def _write(results: dict[str, Any], out: str, console: Console) -> None:
    write_json(os.path.join(out, "results.json"), results)
    write_text(os.path.join(out, "results.md"), report.markdown(results))
    _print(results, console)
    reused = f"; {results['reused_runs']} run(s) reused from {RUN_LOG}" if results.get("reused_runs") else ""
    console.print(f"wrote {out}/results.json, results.md" + "".join(f", {p}" for p in results["plots"])
                  + f"; wall time {results['wall_s']:.0f} s{reused}")


def _ordered(methods: list[dict[str, Any]], rep: int) -> list[dict[str, Any]]:
    """Alternate the order between repetitions (slow drift of the machine hits every method alike).

    The run without checkpointing stays first: its step time sizes the budget runs (and their
    baseline); an A/B stays right after the budget run whose interval it measures.
    """
    if rep % 2 == 0:
        return methods
    units: list[list[dict[str, Any]]] = []
    for m in methods[1:]:
        if m["name"] == "autockpt-ab" and units:
            units[-1].append(m)
        else:
            units.append([m])
    return methods[:1] + [m for unit in reversed(units) for m in unit]


def _ab_method(method: dict[str, Any], runs: list[dict[str, Any]], rep: int, framework: str, workload: str,
               settings: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The A/B after a budget run: that run's final interval, blocks of :func:`ab_block` steps,
    ``ab_cycles`` on/off pairs after the warm-up (``every`` 0: the budget run chose none)."""
    budget_run = next((r["train"] for r in reversed(runs) if (r["rep"], r["framework"], r["workload"]) ==
                       (rep, framework, workload) and r["method"] == {"name": "autockpt-budget", "budget": method["budget"]}),
                      {})
    every = int(budget_run.get("final_interval_steps") or 0)
    if every < 1:
        return {**method, "every": 0, "block": 0}, settings["steps"]
    block = ab_block(every)
    return {**method, "every": every, "block": block}, settings["warmup"] + 2 * settings["ab_cycles"] * block


def _restores(framework: str, method: dict[str, Any], settings: dict[str, Any]) -> bool:
    """Whether a run of ``method`` is followed by a restore run (if it took a checkpoint).

    --quick restores only autockpt and the framework's synchronous ModelCheckpoint (the comparison
    that matters most), to stay within its minutes; the full study restores every method.
    """
    quick_ok = not settings["quick"] or method["name"] in ("autockpt", NATIVE_SYNC[framework])
    return settings["restore"] and quick_ok and method["name"] not in ("none", "autockpt-ab")


def _identity(framework: str, workload: Workload, method: dict[str, Any], rep: int, steps: int,
              settings: dict[str, Any], workers: dict[str, str] | None, versions: dict[str, str]) -> dict[str, Any]:
    """What defines a run in ``runs.jsonl`` (:mod:`.study.run_log`): a recorded run is reused only
    by a run with all of these equal (``every``, ``checkpoints``, the budget window and the A/B
    cycles are in ``method`` and ``steps``)."""
    return {"framework": framework, "worker": (workers or WORKERS)[framework], "workload": workload.to_json(),
            "method": method, "rep": rep, "steps": steps, "warmup": settings["warmup"], "threads": settings["threads"],
            "keras_backend": settings["keras_backend"], "restore": _restores(framework, method, settings),
            "versions": versions}


def _measure(framework: str, workload: Workload, method: dict[str, Any], rep: int, steps: int, settings: dict[str, Any],
             scratch: str, timeout: float, workers: dict[str, str] | None) -> dict[str, Any]:
    key = report.method_key(method)
    tag = f"{framework}-{workload.name}-{key}-{rep}"
    workdir = os.path.join(scratch, tag)
    ckpt_dir = os.path.join(workdir, "ckpt")
    shutil.rmtree(workdir, ignore_errors=True)
    common = {"dir": ckpt_dir, "steps": steps, "warmup": settings["warmup"],
              "reference": os.path.join(workdir, "reference.npz")}
    kw = {"timeout": timeout, "threads": settings["threads"], "keras_backend": settings["keras_backend"], "workers": workers}
    if method["name"] == "autockpt-ab" and not method["every"]:
        train: dict[str, Any] = {"framework": framework, "workload": workload.name, "method": "autockpt-ab",
                                 "skipped": "its budget run chose no interval (failed or too short)"}
    else:
        train = run_case(framework, "train", workload, method, workdir, "train", **kw, **common)
    restore = None
    if _restores(framework, method, settings) and "error" not in train and "skipped" not in train \
            and train.get("checkpoint_steps"):
        restore = run_case(framework, "restore", workload, method, workdir, "restore", **kw, **common)
    for name in os.listdir(workdir) if os.path.isdir(workdir) else []:  # checkpoints are big; logs stay
        path = os.path.join(workdir, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif name.endswith(".npz"):
            os.unlink(path)
    return {"framework": framework, "workload": workload.name, "method": method, "rep": rep, "train": train, "restore": restore}


def _plots(results: dict[str, Any], out: str) -> list[str]:
    rows = results["rows"]
    names = {"slowdown_vs_interval.png": lambda p: plots.slowdown_vs_interval(rows, results["frameworks"], p),
             "blocked_vs_size.png": lambda p: plots.blocked_vs_size(rows, p),
             "size_per_format.png": lambda p: plots.size_per_format(rows, p)}
    for name, draw in names.items():  # drawn beside, then renamed over the old one
        tmp = os.path.join(out, f".{name}")
        draw(tmp)
        os.replace(tmp, os.path.join(out, name))
    return list(names)


def _print(results: dict[str, Any], console: Console) -> None:
    body = report.table_rows(results["rows"])
    table = Table(title=f"Checkpointing cost, {results['machine']['description']}")
    for col in report.HEAD:
        table.add_column(col, justify="left" if col in ("framework", "workload", "method", "format", "exact resume") else "right")
    for row in body:
        table.add_row(*row)
    console.print(table)
    for t in results["targets"]:
        console.print(f"{report.verdict(t)}: {t['framework']} {t['workload']}: {t['target']} — {t['measured']}")
    for row in results["rows"]:
        for problem in row.get("problems", []):
            console.print(f"[yellow]{row['framework']} {row['workload']} {row['label']}[/yellow]: {problem}")


def _versions() -> dict[str, str]:
    out = {}
    for package in FRAMEWORK_PACKAGES:
        try:
            out[package] = importlib.metadata.version(package if package != "tensorflow" else "tensorflow-cpu")
        except importlib.metadata.PackageNotFoundError:
            try:
                out[package] = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def _argv(args: argparse.Namespace) -> list[str]:
    out = ["--quick"] if args.quick else []  # --fresh changes no figure: left out
    for name in ("frameworks", "workloads", "methods", "every", "checkpoints", "warmup", "budgets", "budget_window",
                 "ab_cycles", "repeats", "threads"):
        value = getattr(args, name)
        if value not in (None, ""):
            out += [f"--{name.replace('_', '-')}", str(value)]
    return out + ["--out", args.out]

