"""The interval the budget chooses against the shortest fixed interval that keeps the budget.

For each framework, one process per run trains a study workload for ``--epochs`` epochs with
``AutoCheckpoint`` at fixed intervals (``every_n_steps``) and with the overhead budget alone
(twice, first and last), and reads autockpt's own measured overhead of each run (the summary:
steps with checkpoint work against clean steps, with its ~95% band; docs/policy.md). The
shortest fixed interval whose measured overhead stays within the budget is the reference; the
budget runs' final intervals are reported against it. Measured in the run, not against a
baseline process: between processes this machine's noise is larger than the budget
(docs/comparison.md).

    python examples/interval_sweep.py --workload quick --every 150,300,600,1200 --json sweep.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
from typing import Any

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="quick", help="quick (goodput --quick's MLP), small or medium")
    parser.add_argument("--frameworks", default="lightning,keras", help="comma-separated (default both)")
    parser.add_argument("--every", default="150,300,600,1200", help="fixed intervals in steps")
    parser.add_argument("--steps-per-epoch", type=int, default=1560, help="steps per epoch (default 1560)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    parser.add_argument("--budget", type=float, default=0.02, help="the overhead budget (default 0.02)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--run", nargs=2, metavar=("FRAMEWORK", "EVERY"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _workload(name: str, steps_per_epoch: int) -> Any:
    from autockpt_bench.study.workloads import FULL, QUICK

    base = QUICK["small"] if name == "quick" else FULL[name]
    return dataclasses.replace(base, steps_per_epoch=steps_per_epoch)


def run_one(framework: str, every: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run in this process: autockpt's summary figures."""
    workload = _workload(args.workload, args.steps_per_epoch)
    keywords: dict[str, Any] = {"overhead_budget": args.budget, "verbose": False}
    if every != "budget":
        keywords["every_n_steps"] = int(every)
    directory = tempfile.mkdtemp(prefix="autockpt-sweep-")
    if framework == "lightning":
        import lightning.pytorch as pl
        import torch

        from autockpt_bench.workers.lightning_models import StudyModule, loader
        from autockpt_lightning import AutoCheckpoint

        torch.set_num_threads(1)
        callback: Any = AutoCheckpoint(directory, **keywords)
        pl.Trainer(max_epochs=args.epochs, callbacks=[callback], logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False, accelerator="cpu",
                   devices=1).fit(StudyModule(workload), loader(workload))  # fmt: skip
    else:
        os.environ["KERAS_BACKEND"] = "tensorflow"
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        from autockpt_bench.study.workloads import make_data
        from autockpt_bench.workers.keras_models import build_model
        from autockpt_keras import AutoCheckpoint as KerasAutoCheckpoint

        model = build_model(workload)
        x, y = make_data(workload, workload.steps_per_epoch)
        callback = KerasAutoCheckpoint(directory, **keywords)
        model.fit(x, y, batch_size=workload.batch, epochs=args.epochs, shuffle=False, verbose=0, callbacks=[callback])
    summary = callback.summary
    return {"framework": framework, "every": every, "checkpoints": summary.checkpoints,
            "overhead": summary.overhead, "band": summary.overhead_band, "interval": summary.interval_steps,
            "rule": summary.interval_rule, "hooks": summary.hooks,
            "steps": [event.step for event in callback.events]}  # fmt: skip


def verdicts(runs: list[dict[str, Any]], budget: float) -> dict[str, Any]:
    """The shortest fixed interval within the budget and each budget run's interval against it."""
    fixed = sorted((int(r["every"]), r) for r in runs if r["every"] != "budget")
    within = [k for k, r in fixed if r["overhead"] is not None and r["overhead"] <= budget]
    shortest = within[0] if within else None
    chosen = [r["interval"] for r in runs if r["every"] == "budget"]
    return {"shortest_within_budget": shortest, "chosen": chosen,
            "ratios": [c / shortest for c in chosen] if shortest else None}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.run:
        print("RESULT " + json.dumps(run_one(args.run[0], args.run[1], args)), flush=True)
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console(width=110)
    forwarded = ["--workload", args.workload, "--steps-per-epoch", str(args.steps_per_epoch),
                 "--epochs", str(args.epochs), "--budget", str(args.budget)]  # fmt: skip
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}",
        "workload": args.workload, "steps_per_epoch": args.steps_per_epoch, "epochs": args.epochs,
        "budget": args.budget, "frameworks": {},
    }  # fmt: skip
    for framework in [f for f in args.frameworks.split(",") if f]:
        runs = []
        for every in ["budget", *args.every.split(","), "budget"]:
            done = subprocess.run([sys.executable, __file__, "--run", framework, every, *forwarded],
                                  capture_output=True, text=True)  # fmt: skip
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                raise RuntimeError(f"{framework} every={every} failed:\n{done.stderr[-3000:]}")
            runs.append(json.loads(lines[-1][len("RESULT "):]))
        verdict = verdicts(runs, args.budget)
        results["frameworks"][framework] = {"runs": runs, **verdict}
        table = Table(title=f"{framework}, {args.workload}: autockpt's measured overhead per interval "
                            f"(budget {args.budget:.0%})")  # fmt: skip
        for column in ("run", "interval (steps)", "checkpoints", "overhead ±95%", "hooks"):
            table.add_column(column, justify="left" if column == "run" else "right")
        for r in runs:
            overhead = "n/a" if r["overhead"] is None else f"{r['overhead']:.2%} ±{(r['band'] or 0):.2%}"
            name = "the budget" if r["every"] == "budget" else f"every {r['every']}"
            table.add_row(name, str(r["interval"]), str(r["checkpoints"]), overhead,
                          f"{(r['hooks'] or 0):.2%}")  # fmt: skip
        console.print(table)
        ratios = ", ".join(f"{x:.2f}×" for x in verdict["ratios"] or [])
        console.print(f"shortest fixed interval within the budget: {verdict['shortest_within_budget']}; "
                      f"the budget chose {verdict['chosen']} ({ratios or 'no fixed interval kept it'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
