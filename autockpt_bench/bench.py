"""``autockpt bench``: snapshot stall, persist throughput, host memory and training slowdown,
against the physical floors and against Lightning's and Keras' own checkpointing.

Every configuration runs in a fresh interpreter (so the core imports no framework, and each
peak-memory figure belongs to one configuration): ``autockpt_bench.workers.floors``,
``autockpt_bench.workers.lightning_bench`` and ``autockpt_bench.workers.keras_bench`` (workers, see their docstrings).
Per state size:

- floors: memcpy into a preallocated buffer; raw write + fsync in the benchmark directory;
- isolated (no training): autockpt's copy into reusable buffers, and the persist of a
  Lightning ``.ckpt`` and a Keras ``.safetensors`` checkpoint, next to ``torch.save`` + fsync
  and Lightning's ``TorchCheckpointIO``;
- training runs with a checkpoint every ``--every`` steps: no checkpointing (twice, before
  and after, for the noise), autockpt (copy on the training thread, persisted by the
  persist process or by a writer thread; copy overlapped), Lightning ``ModelCheckpoint``,
  ``ModelCheckpoint`` + ``AsyncCheckpointIO``; Keras: none, autockpt (both persist modes),
  ``ModelCheckpoint`` (``.weights.h5``). Runs wait for the persist process to be ready
  before training (steady state).

Figures: stall per checkpoint (ms) and ÷ memcpy floor; persist throughput and ÷ raw write;
extra peak host memory (VmHWM minus the run without checkpointing) ÷ state bytes; mean step
time and slowdown vs no checkpointing, and autockpt's slowdown ÷ ModelCheckpoint's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from autockpt_core.units import format_size, parse_size

from .workers.measure import parse_result, thread_caps

#: Worker modules, each run as ``python -m MODULE`` in a fresh interpreter.
WORKERS = {
    "floors": "autockpt_bench.workers.floors",
    "lightning": "autockpt_bench.workers.lightning_bench",
    "keras": "autockpt_bench.workers.keras_bench",
}

HELP = "measure snapshot stall, persist throughput, memory and training slowdown vs the physical limits and baselines"

DEFAULT_SIZES = "10MB,100MB,1GB,4GB"
LIGHTNING_METHODS = ("none", "autockpt", "autockpt-thread", "autockpt-overlap", "autockpt-auto", "modelcheckpoint", "async", "none")
KERAS_METHODS = ("none", "autockpt", "autockpt-thread", "modelcheckpoint", "none")
LABELS = {
    "autockpt": "autockpt (sync copy, persist process)",
    "autockpt-thread": "autockpt (sync copy, persist thread)",
    "autockpt-overlap": "autockpt (copy overlapped, persist process)",
    "autockpt-auto": "autockpt (copy mode measured, persist process)",
    "modelcheckpoint": "ModelCheckpoint",
    "async": "ModelCheckpoint + AsyncCheckpointIO",
}
MIN_STEPS = 200  # training steps of the 10 MB runs; scaled down with size, never below --checkpoints
PEAK_FACTOR = 4.0  # estimated peak host memory of the largest configuration, in state sizes
PEAK_BASE = 2 << 30  # interpreters, frameworks, data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"state sizes (default {DEFAULT_SIZES}; sizes that do not fit in free memory are skipped)")
    parser.add_argument("--dir", default="autockpt-bench-tmp", help="where checkpoints and the raw-write floor are written (removed afterwards)")
    parser.add_argument("--json", default="autockpt-bench.json", help="JSON results file")
    parser.add_argument("--markdown", default="", help="also write the tables as Markdown to this file")
    parser.add_argument("--frameworks", default="lightning,keras", help="lightning, keras or both (default)")
    parser.add_argument("--every", type=int, default=10, help="checkpoint interval in steps for the training runs")
    parser.add_argument("--checkpoints", type=int, default=4,
                        help="checkpoints per training run (at least: runs of small states get more, see MIN_STEPS)")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads of torch and TensorFlow in the training runs (0: the frameworks' default)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each isolated measurement")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the sequence of training configurations this many times (alternating order); medians are reported")
    parser.add_argument("--methods", default="",
                        help="only these training methods (comma-separated, e.g. autockpt,autockpt-auto; "
                             "the runs without checkpointing always run); default: all")
    parser.add_argument("--keras-backend", default="tensorflow", help="KERAS_BACKEND for the Keras runs")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per configuration")


def run(args: argparse.Namespace) -> int:
    sizes = [parse_size(s) for s in str(args.sizes).split(",") if s.strip()]
    if not sizes or min(sizes) <= 0:
        raise ValueError(f"--sizes needs positive sizes, e.g. 10MB,100MB; got {args.sizes!r}")
    frameworks = [f.strip() for f in str(args.frameworks).split(",") if f.strip()]
    unknown = set(frameworks) - {"lightning", "keras"}
    if unknown:
        raise ValueError(f"unknown framework(s) {sorted(unknown)}; use lightning, keras or both")
    if args.every < 2 or args.checkpoints < 1 or args.repeat < 1:
        raise ValueError("--every must be >= 2, --checkpoints and --repeat >= 1")
    known = set(LIGHTNING_METHODS) | set(KERAS_METHODS)
    unknown_methods = set(_methods_filter(args)) - known
    if unknown_methods:
        raise ValueError(f"unknown --methods {sorted(unknown_methods)}; use some of {', '.join(sorted(known - {'none'}))}")
    available = _mem_available()
    kept = [s for s in sizes if available is None or s * PEAK_FACTOR + PEAK_BASE <= available]
    for s in sizes:
        if s not in kept:
            print(f"skipping {format_size(s)}: needs about {format_size(s * PEAK_FACTOR + PEAK_BASE)} of free memory, "
                  f"{format_size(available or 0)} available")
    console = Console(width=200)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "machine": machine_info(),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": "autockpt bench " + " ".join(_argv_of(args)),
        "settings": {"every": args.every, "checkpoints": args.checkpoints, "reps": args.reps, "repeat": args.repeat,
                     "keras_backend": args.keras_backend, "threads": args.threads or "framework default"},
        "sizes": [],
    }
    root = os.path.abspath(args.dir)
    try:
        for size in kept:
            results["sizes"].append(_bench_size(size, root, frameworks, args, console))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["wall_s"] = time.perf_counter() - started
    summarize(results)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print_tables(results, console)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(results))
    console.print(f"wrote {args.json}" + (f" and {args.markdown}" if args.markdown else "")
                  + f"; wall time {results['wall_s']:.0f}s")
    return 0


# -- running the workers --------------------------------------------------------------------------


def _worker(module: str, argv: list[str], env_extra: dict[str, str], timeout: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3", **env_extra)
    cmd = [sys.executable, "-m", module, *argv]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s", "cmd": cmd}
    result = parse_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"error": f"exit status {proc.returncode}: " + " | ".join(tail), "cmd": cmd}
    result["worker_wall_s"] = time.perf_counter() - start
    return result


def _bench_size(size: int, root: str, frameworks: list[str], args: argparse.Namespace, console: Console) -> dict[str, Any]:
    label = format_size(size)
    directory = os.path.join(root, label)
    console.print(f"[bold]{label}[/bold]: floors", end="")
    entry: dict[str, Any] = {"nominal_bytes": size, "runs": []}
    entry["floor"] = _worker(WORKERS["floors"], ["--bytes", str(size), "--dir", directory, "--reps", str(args.reps)], {}, args.timeout)
    checkpoints = max(args.checkpoints, int(MIN_STEPS * 10e6 / size) // args.every)
    entry["checkpoints"] = checkpoints
    train_args = ["--bytes", str(size), "--every", str(args.every), "--checkpoints", str(checkpoints)]
    threads_env = _threads_env(args.threads)
    if "lightning" in frameworks:
        console.print(", isolated persist", end="")
        entry["persist"] = _worker(
            WORKERS["lightning"], ["persist", "--bytes", str(size), "--dir", directory, "--reps", str(args.reps)],
            {}, args.timeout,
        )
    for rep in range(args.repeat):
        for framework, methods, module, env in (
            ("lightning", LIGHTNING_METHODS, WORKERS["lightning"], threads_env),
            ("keras", KERAS_METHODS, WORKERS["keras"], {"KERAS_BACKEND": args.keras_backend, **threads_env}),
        ):
            if framework not in frameworks:
                continue
            wanted = _methods_filter(args)
            if wanted:
                methods = tuple(m for m in methods if m == "none" or m in wanted)
            order = methods if rep % 2 == 0 else tuple(reversed(methods))
            for i, method in enumerate(order):
                console.print(f", {framework} {method}", end="")
                run_dir = os.path.join(directory, f"{framework}-{rep}-{i}-{method}")
                entry["runs"].append(_worker(module, ["train", "--method", method, "--dir", run_dir, *train_args], env, args.timeout))
                shutil.rmtree(run_dir, ignore_errors=True)
    console.print()
    for run_ in entry["runs"] + [entry["floor"], entry.get("persist") or {}]:
        if "error" in run_:
            console.print(f"[red]failed[/red] {' '.join(run_['cmd'][2:])}: {run_['error']}")
    return entry


def _methods_filter(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(m.strip() for m in str(getattr(args, "methods", "") or "").split(",") if m.strip())


# -- figures ------------------------------------------------------------------------------------


def summarize(results: dict[str, Any]) -> None:
    """Add the derived figures (ratios, slowdowns) to ``results`` in place."""
    for entry in results["sizes"]:
        floor = entry.get("floor") or {}
        memcpy_rate = floor["state_bytes"] / floor["memcpy_s"] if floor.get("memcpy_s") else None
        raw_rate = floor["state_bytes"] / floor["raw_write_s"] if floor.get("raw_write_s") else None
        entry["memcpy_gbps"] = memcpy_rate / 1e9 if memcpy_rate else None
        entry["raw_write_gbps"] = raw_rate / 1e9 if raw_rate else None
        rows = []
        for framework in ("lightning", "keras"):
            runs = [r for r in entry["runs"] if r.get("framework") == framework and "error" not in r]
            base = [r for r in runs if r["method"] == "none" and _step_s(r)]
            if not base:
                continue
            base_steps = [_step_s(r) for r in base]
            base_step = statistics.median(base_steps)
            base_rss = statistics.median(r["peak_rss_bytes"] for r in base)
            noise = (max(base_steps) - min(base_steps)) / base_step
            rows.append({"framework": framework, "method": "none", "step_ms": base_step * 1e3, "slowdown": 0.0,
                         "baseline_noise": noise, "runs": len(base)})
            methods = list(dict.fromkeys(r["method"] for r in runs if r["method"] != "none"))
            for method in methods:
                r = _aggregate([x for x in runs if x["method"] == method])
                state = r["state_bytes"]
                row: dict[str, Any] = {"framework": framework, "method": r["method"], "state_bytes": state,
                                       "copy_mode": r.get("copy_mode"), "fsync": r.get("fsync", True)}
                row["stall_ms"] = r["stall_s"] * 1e3
                row["stall_first_ms"] = r["stall_first_s"] * 1e3 if r.get("stall_first_s") is not None else None
                row["stall_floor"] = r["stall_s"] / (state / memcpy_rate) if memcpy_rate else None
                if r.get("persist_s") and r.get("file_bytes"):
                    row["persist_gbps"] = r["file_bytes"] / r["persist_s"] / 1e9
                    row["persist_raw"] = (r["file_bytes"] / r["persist_s"]) / raw_rate if raw_rate else None
                row["mem_ratio"] = (r["peak_rss_bytes"] - base_rss) / state
                row["overlap_ratio"] = r.get("overlap_ratio")
                row["persist_mode"] = r.get("persist_mode")
                row["step_ms"] = _step_s(r) * 1e3
                row["slowdown"] = _step_s(r) / base_step - 1.0
                row["runs"] = r["runs"]
                rows.append(row)
            ref = next((x for x in rows if x["framework"] == framework and x["method"] == "modelcheckpoint"), None)
            for row in rows:
                if row["framework"] == framework and row["method"].startswith("autockpt") and ref and ref["slowdown"] > 0:
                    row["slowdown_vs_modelcheckpoint"] = row["slowdown"] / ref["slowdown"]
        entry["rows"] = rows
        persist = entry.get("persist") or {}
        iso: dict[str, Any] = {}
        if "error" not in persist and persist.get("state_bytes") and raw_rate and memcpy_rate:
            n = persist["state_bytes"]
            iso["snapshot_ms"] = persist["snapshot_s"] * 1e3
            iso["snapshot_floor"] = persist["snapshot_s"] / (n / memcpy_rate)
            for key in ("autockpt_ckpt", "autockpt_ckpt_zipcrc", "torch_save_fsync", "lightning_io"):
                iso[f"{key}_gbps"] = n / persist[f"{key}_s"] / 1e9
                iso[f"{key}_raw"] = (n / persist[f"{key}_s"]) / raw_rate
        if floor.get("safetensors_persist_s") and raw_rate:
            rate = floor["safetensors_bytes"] / floor["safetensors_persist_s"]
            iso["autockpt_safetensors_gbps"] = rate / 1e9
            iso["autockpt_safetensors_raw"] = rate / raw_rate
        entry["isolated"] = iso


def _step_s(run: dict[str, Any]) -> float:
    """Step time of a run: the median over its checkpoint intervals (mean if not recorded)."""
    return run.get("median_step_s") or run.get("mean_step_s") or 0.0


def _aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One run from repeated ones: the median of every number, the first value otherwise."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        values = [r.get(key) for r in runs]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and all(isinstance(v, (int, float)) for v in values):
            out[key] = statistics.median(values)  # type: ignore[arg-type]
    out["runs"] = len(runs)
    return out


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """(headers, rows) of the training table and of the isolated table, as strings."""
    train_head = ["size", "framework", "method", "stall ms (median / first)", "stall ÷ memcpy", "persist GB/s", "persist ÷ raw",
                  "extra host mem ÷ state", "step ms (median)", "slowdown", "slowdown ÷ ModelCheckpoint's",
                  "step overlapping a persist ÷ clean"]
    train: list[list[str]] = []
    iso_head = ["size", "memcpy GB/s", "raw write+fsync GB/s", "autockpt copy ms (÷ memcpy)",
                "autockpt .ckpt GB/s (÷ raw)", ".ckpt with zip CRC", "autockpt .safetensors (÷ raw)",
                "torch.save+fsync (÷ raw)", "Lightning TorchCheckpointIO, no fsync (÷ raw)"]
    iso: list[list[str]] = []
    for entry in results["sizes"]:
        size = format_size(entry["nominal_bytes"])
        for row in entry.get("rows", []):
            label = LABELS.get(row["method"], row["method"])
            if row["method"] == "none":
                label = f"no checkpoints (baseline; noise {row['baseline_noise'] * 100:.0f}%)"
            elif row["method"] == "autockpt-auto" and row.get("copy_mode"):
                label = label.replace("measured", f"measured, kept {row['copy_mode']}")
            persist = _fmt(row.get("persist_gbps"), ".2f") + ("" if row.get("fsync", True) else " (no fsync)")
            train.append([
                size, row["framework"], label,
                f"{_fmt(row.get('stall_ms'), '.1f')} / {_fmt(row.get('stall_first_ms'), '.0f')}" if "stall_ms" in row else "-",
                _fmt(row.get("stall_floor"), ".2f"),
                persist, _fmt(row.get("persist_raw"), ".2f"), _fmt(row.get("mem_ratio"), ".2f"),
                _fmt(row.get("step_ms"), ".1f"), _fmt(row.get("slowdown") * 100 if row.get("slowdown") is not None else None, "+.0f") + "%",
                _fmt(row.get("slowdown_vs_modelcheckpoint"), ".2f"),
                _fmt(row.get("overlap_ratio"), ".2f"),
            ])
        i = entry.get("isolated") or {}
        pair = _pair_formatter(i)

        iso.append([
            size, _fmt(entry.get("memcpy_gbps"), ".1f"), _fmt(entry.get("raw_write_gbps"), ".2f"),
            f"{_fmt(i.get('snapshot_ms'), '.1f')} ({_fmt(i.get('snapshot_floor'), '.2f')})",
            pair("autockpt_ckpt"), pair("autockpt_ckpt_zipcrc"), pair("autockpt_safetensors"),
            pair("torch_save_fsync"), pair("lightning_io"),
        ])
    return train_head, train, iso_head, iso


def _pair_formatter(isolated: dict[str, Any]) -> Any:
    def pair(key: str) -> str:
        return f"{_fmt(isolated.get(key + '_gbps'), '.2f')} ({_fmt(isolated.get(key + '_raw'), '.2f')})"

    return pair


def print_tables(results: dict[str, Any], console: Console) -> None:
    train_head, train, iso_head, iso = table_rows(results)
    for title, head, rows in (
        ("Isolated (no training): copy and persist vs the physical floors", iso_head, iso),
        (f"Training with a checkpoint every {results['settings']['every']} steps", train_head, train),
    ):
        table = Table(title=title)
        for col in head:
            table.add_column(col, justify="left" if col in ("size", "framework", "method") else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)


def markdown(results: dict[str, Any]) -> str:
    """The two tables as Markdown, with the machine, date and command."""
    train_head, train, iso_head, iso = table_rows(results)
    m = results["machine"]
    lines = [
        f"Machine: {m['description']}; date {results['date']}; command `{results['command']}`; "
        f"wall time {results.get('wall_s', 0):.0f}s.",
        "",
    ]
    for head, rows in ((iso_head, iso), (train_head, train)):
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines.append("")
    return "\n".join(lines)


# -- machine ----------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory and load, for the results header."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    total = _meminfo("MemTotal")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    cores = os.cpu_count()
    return {
        "cpu": model,
        "cores": cores,
        "memory_bytes": total,
        "load_average": load,
        "python": platform.python_version(),
        "description": (
            f"{cores}-core CPU ({model}), {format_size(total or 0)} RAM, load average at start "
            + (f"{load[0]:.2f}" if load else "n/a")
        ),
    }


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _mem_available() -> int | None:
    return _meminfo("MemAvailable")


def _threads_env(threads: int) -> dict[str, str]:
    """Environment that caps torch's and TensorFlow's intra-op threads (empty for 0)."""
    caps = thread_caps(threads)
    return {"AUTOCKPT_BENCH_THREADS": str(threads), **caps} if caps else {}


def _argv_of(args: argparse.Namespace) -> list[str]:
    out = []
    for name in ("sizes", "frameworks", "every", "checkpoints", "threads", "repeat", "reps", "keras_backend"):
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return out
