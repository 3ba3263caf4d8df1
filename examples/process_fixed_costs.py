"""What checkpointing adds to every training process: its start and its end.

A job that fails is restarted, and every attempt pays the process's fixed costs again: the
imports and the resume before the first step, and, in the attempt that finishes, the end of
``fit()`` (a final checkpoint, waiting for writes to be durable) and the exit. This runs the
study's goodput workers (``autockpt_bench/workers``, the processes ``autockpt goodput`` kills)
once per method and round, never killed, with a fresh checkpoint directory, and splits each
process's wall time from its events:

- *start s*: spawn to the worker's first line (the interpreter);
- *to resume s*: the worker's first line to the resume point (imports, model, data, the method's
  setup and restore);
- *train s*: the resume point to the last step's end;
- *fit end s*: the last step's end to ``fit()``'s return (the end-of-training hooks: autockpt's
  final checkpoint and wait for its persist; the natives' last save);
- *exit s*: ``fit()``'s return to the process's end (interpreter shutdown: atexit handlers,
  autockpt's persist process stopped, the frameworks' teardown).

Methods: ``none``, ``autockpt`` (``AutoCheckpoint(dirpath)``, nothing else set: a 2% budget, a
final checkpoint at the end of training, the signal handlers), ``every-epoch`` (Lightning's
``ModelCheckpoint``, Keras' ``BackupAndRestore``, each per epoch). Rounds interleave the methods.
Prints a table (medians, min–max) and writes ``--json``.

    python examples/process_fixed_costs.py --frameworks lightning,keras --steps 400 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autockpt_bench.study.protocol import read_events, write_spec
from autockpt_bench.study.runner import command, compile_packages, worker_env
from autockpt_bench.study.workloads import preset

METHODS = {
    "none": {"name": "none"},
    "autockpt": {"name": "autockpt-budget", "budget": 0.02, "user_defaults": True},
    "every-epoch": {"name": "every-epoch"},
}
PARTS = {"start_s": "start s", "to_resume_s": "to resume s", "train_s": "train s", "fit_end_s": "fit end s",
         "exit_s": "exit s", "wall_s": "wall s"}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default="lightning,keras")
    parser.add_argument("--workload", default="small", choices=("small", "medium", "large"))
    parser.add_argument("--steps", type=int, default=400, help="steps of the job")
    parser.add_argument("--epochs", type=int, default=2, help="epochs the steps are cut into")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--work", default=None, help="keep the workers' directories here (default: a temporary one)")
    return parser.parse_args(argv)


def run_once(framework: str, method: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    """One worker process, never killed; its wall time split from its events."""
    mdir = work / f"{framework}-{method}"
    shutil.rmtree(mdir, ignore_errors=True)
    mdir.mkdir(parents=True)
    workload = dataclasses.replace(preset(False)[args.workload], steps_per_epoch=args.steps // args.epochs)
    spec, log = mdir / "spec.json", mdir / "events.jsonl"
    write_spec(spec, workload, METHODS[method], dir=str(mdir / "ckpt"), log=str(log), steps=args.steps, warmup=0,
               threads=args.threads, keras_backend=None, out=str(mdir / "unused.json"), finish_fit=True)
    spawned = time.time()
    done = subprocess.run(command(framework, "goodput", spec), env=worker_env(args.threads),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    ended = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"{framework} {method} exited {done.returncode}:\n{done.stdout[-3000:]}")
    events = read_events(log)
    first = {e["event"]: float(e["t"]) for e in reversed(events)}  # the first of each kind
    last_step = max(float(e["t"]) for e in events if e["event"] == "step")
    return {
        "start_s": first["start"] - spawned,
        "to_resume_s": first["resumed"] - first["start"],
        "train_s": last_step - first["resumed"],
        "fit_end_s": first["done"] - last_step,
        "exit_s": ended - first["done"],
        "wall_s": ended - spawned,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    frameworks = [f for f in args.frameworks.split(",") if f]
    methods = [m for m in args.methods.split(",") if m]
    compile_packages()  # as an installed wheel is: no worker compiles autockpt's modules
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="fixed-costs-"))
    runs: dict[str, dict[str, list[dict[str, float]]]] = {f: {m: [] for m in methods} for f in frameworks}
    for _ in range(args.rounds):
        for framework in frameworks:
            for method in methods:
                runs[framework][method].append(run_once(framework, method, args, work))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.workload} workload, {args.steps} steps in {args.epochs} epochs, {args.rounds} rounds: "
          "median (min-max), seconds")
    print("| framework | method | " + " | ".join(PARTS.values()) + " |")
    print("|---|---|" + "---|" * len(PARTS))
    for framework in frameworks:
        for method in methods:
            cells = []
            for part in PARTS:
                values = [r[part] for r in runs[framework][method]]
                cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
            print(f"| {framework} | {method} | " + " | ".join(cells) + " |")
    if args.json:
        result = {"args": vars(args), "python": platform.python_version(), "machine": platform.machine(),
                  "cpus": os.cpu_count(), "runs": runs}
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
