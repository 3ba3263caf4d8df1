"""A framework-free stand-in for the study workers (``autockpt_bench.workers.*_study``).

It follows :mod:`autockpt_bench.study.protocol` with sleeps instead of training, so the
commands' orchestration (process per run, restore runs, real SIGKILLs, accounting, reports) is
tested in seconds. Native methods block 20 ms per checkpoint, autockpt 1 ms; only autockpt
resumes exactly; native every-epoch resumes at the epoch start. In ``goodput``, autockpt's methods
act on SIGTERM (a checkpoint of the step, then exit 143); the native ones die by it.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time

import numpy as np

from autockpt_bench.study.in_process_ab import Alternation, ab_figures
from autockpt_bench.study.protocol import EventLog, read_spec, write_json

STEP_S = 0.004


def _blocked(method: dict) -> float:
    return 0.001 if method["name"].startswith("autockpt") else 0.02


def _interval(method: dict, steps_per_epoch: int) -> int:
    if "every" in method:
        return int(method["every"])
    if method["name"].startswith("autockpt"):
        return 7
    return steps_per_epoch


def _newest(directory: str) -> int:
    steps = [int(m.group(1)) for n in os.listdir(directory) if (m := re.fullmatch(r"ckpt-(\d+)\.bin", n))] if os.path.isdir(directory) else []
    return max(steps, default=0)


def _save(directory: str, step: int, method: dict) -> float:
    os.makedirs(directory, exist_ok=True)
    start = time.perf_counter()
    with open(os.path.join(directory, f"ckpt-{step}.bin.tmp"), "wb") as f:
        f.write(b"x" * 1000)
    os.replace(os.path.join(directory, f"ckpt-{step}.bin.tmp"), os.path.join(directory, f"ckpt-{step}.bin"))
    time.sleep(_blocked(method))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("--spec", required=True)
    args = parser.parse_args()
    workload, method, spec = read_spec(args.spec)
    every = _interval(method, workload.steps_per_epoch)
    base = {"framework": "fake", "workload": workload.name, "method": method["name"]}
    if args.case == "train":
        times, ckpts, blocked = [], [], []
        ab = Alternation(int(method["block"]), spec["warmup"]) if method["name"] == "autockpt-ab" else None
        for step in range(1, spec["steps"] + 1):
            t = time.perf_counter()
            time.sleep(STEP_S)
            if method["name"] != "none" and step % every == 0 and (ab is None or ab.is_on(step)):
                ckpts.append(step)
                blocked.append(_save(spec["dir"], step, method))
            times.append(time.perf_counter() - t)
        window = times[spec["warmup"]:]
        np.savez(spec["reference"], w0000=np.ones(3))
        result = {**base, "params": workload.params, "state_bytes": workload.state_bytes,
                  "steps": spec["steps"], "warmup": spec["warmup"], "step_s": sum(window) / len(window),
                  "step_s_median": float(np.median(window)), "checkpoint_steps": ckpts, "blocked_s": blocked,
                  "save_s": blocked, "checkpoint_bytes": 1000 if ckpts else None, "format": ".bin",
                  "peak_rss_bytes": 10_000_000 + 1000 * len(ckpts), "threads": spec["threads"]}
        if method["name"] == "autockpt-budget":
            result["final_interval_steps"] = every
        if ab is not None:
            durations = {s: times[s - 1] for s in range(spec["warmup"] + 1, spec["steps"] + 1)}
            loaded = {s: s in ckpts for s in durations}
            result.update(ab_block=ab.block, **ab_figures(durations, {s: ab.is_on(s) for s in durations}, {}, loaded,
                                                          guard=0))
        write_json(spec["out"], result)
        os._exit(0)
    if args.case == "restore":
        resumed = _newest(spec["dir"])
        time.sleep(STEP_S)
        exact = method["name"].startswith("autockpt")
        write_json(spec["out"], {**base, "restore_s": time.time() - spec["started_at"], "load_s": 0.001,
                                 "resumed_step": resumed, "final_step": spec["steps"],
                                 "max_abs_diff": 0.0 if exact else 0.1, "exact": exact})
        return 0
    log = EventLog(spec["log"])
    noticed: list[int] = []
    if method["name"].startswith("autockpt"):  # autockpt acts on a preemption notice: a checkpoint, then 143
        signal.signal(signal.SIGTERM, lambda signum, frame: noticed.append(signum))
    log.write("start")
    time.sleep(0.05)  # "imports"
    resumed = _newest(spec["dir"])
    if method["name"] == "every-epoch":
        resumed -= resumed % workload.steps_per_epoch
    log.write("resumed", step=resumed)
    for step in range(resumed + 1, spec["steps"] + 1):
        time.sleep(STEP_S)
        log.write("step", step=step)
        if method["name"] != "none" and step < spec["steps"] and (step % every == 0 or noticed):
            log.write("checkpoint", step=step, blocked_s=_save(spec["dir"], step, method))
        if noticed and step < spec["steps"]:
            return 128 + noticed[0]
    log.write("done", step=spec["steps"], persist_s=0.002 if method["name"].startswith("autockpt") else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
