"""The framework study from Python: ``python examples/compare_frameworks.py [--full] [--out DIR]``.

Runs the same as ``autockpt compare`` and ``autockpt goodput`` (both frameworks; ``--quick``
unless ``--full``), then reads their JSON back and prints what a user decides from:

1. per framework and workload, what one checkpoint blocks training for with the framework's own
   synchronous ``ModelCheckpoint`` and with autockpt, and the slowdown each costs;
2. per framework, the wall time to finish a job that was really SIGKILLed at random times:
   checkpointing every epoch, the best fixed interval of the sweep, autockpt untuned.

Every figure is measured on this machine in this run (see docs/comparison.md for a full run).
"""

from __future__ import annotations

import argparse
import json
import os

from autockpt_bench.cli import main as autockpt


def compare(out: str, full: bool) -> None:
    assert autockpt(["compare", "--out", out] + ([] if full else ["--quick"])) == 0
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    native = {"lightning": "modelcheckpoint", "keras": "modelcheckpoint-h5"}
    print("\nblocked per checkpoint and slowdown, native ModelCheckpoint vs autockpt (same interval):")
    for r in rows:
        if r["method"] != "autockpt" or r.get("blocked_ms") is None:
            continue
        ref = next(x for x in rows if (x["framework"], x["workload"], x["method"]) == (r["framework"], r["workload"], native[r["framework"]]))
        print(f"  {r['framework']:9} {r['workload']:6}  ModelCheckpoint {ref['blocked_ms']:8.1f} ms "
              f"({ref['slowdown'] * 100:+5.1f}%)   autockpt {r['blocked_ms']:7.1f} ms ({r['slowdown'] * 100:+5.1f}%)"
              f"   exact resume: {'yes' if r.get('exact') else 'no'}")


def goodput(out: str, full: bool) -> None:
    assert autockpt(["goodput", "--out", out] + ([] if full else ["--quick"])) == 0
    with open(os.path.join(out, "goodput.json"), encoding="utf-8") as f:
        data = json.load(f)
    print("\nwall time to finish a job killed at random times, ÷ the failure-free time:")
    for run in data.get("runs", [data]):
        by_kind = {m["kind"]: m for m in run["methods"]}
        best = min((m for m in run["methods"] if m["kind"] == "every_n"), key=lambda m: m["wall_s"])
        print(f"  {run['framework']:9} every epoch {by_kind['every_epoch']['slowdown_factor']:.2f}   "
              f"best fixed ({best['name']}) {best['slowdown_factor']:.2f}   "
              f"autockpt untuned {by_kind['autockpt']['slowdown_factor']:.2f}   (MTBF {run['mtbf_s']:g} s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full study (hours on a 2-core CPU) instead of --quick")
    parser.add_argument("--out", default="autockpt-study", help="output directory")
    args = parser.parse_args()
    compare(os.path.join(args.out, "compare"), args.full)
    goodput(os.path.join(args.out, "goodput"), args.full)
