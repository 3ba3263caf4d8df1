"""Figures, tables and Markdown of ``autockpt compare`` from the workers' raw results (pure).

Input: the list of runs the command collected, each ``{"framework", "workload", "method"
(a method dict), "rep", "train": result, "restore": result | None}`` (results as in
:mod:`.protocol`, or ``{"error": ...}`` / ``{"skipped": ...}``). :func:`summarize` gives one
row per framework × workload × method; every figure is a median over the repetitions and a
spread (min–max) where there are several; slowdowns are paired with the run without
checkpointing of the same repetition, so a noisy machine moves both sides of a ratio.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable

from autockpt_core.policy.stats import t_quantile
from autockpt_core.units import format_size

from .protocol import NATIVE_SYNC

LABELS = {
    "none": "no checkpointing",
    "modelcheckpoint": "ModelCheckpoint",
    "async": "ModelCheckpoint + AsyncCheckpointIO",
    "modelcheckpoint-h5": "ModelCheckpoint (.weights.h5)",
    "modelcheckpoint-keras": "ModelCheckpoint (.keras)",
    "backup-restore": "BackupAndRestore",
    "orbax": "OrbaxCheckpoint (background)",
    "tf-manager": "tf.train.CheckpointManager",
}


def method_key(method: dict[str, Any]) -> str:
    """A unique, readable name of a method and its parameters."""
    if method.get("long"):
        return "none-long"
    if method["name"] in ("autockpt-budget", "autockpt-ab"):
        return f"{method['name']}-{method['budget'] * 100:g}%"
    return str(method["name"])


def method_label(method: dict[str, Any]) -> str:
    name = method["name"]
    if method.get("long"):
        return "no checkpointing, as long as the budget runs"
    if name == "autockpt":
        return f"autockpt, every {method['every']} steps"
    if name == "autockpt-budget":
        return f"autockpt, {method['budget'] * 100:g}% budget"
    if name == "autockpt-ab":
        return f"autockpt, the {method['budget'] * 100:g}% budget's interval, in-process A/B"
    return LABELS.get(name, name)


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _spread(values: Iterable[float | None]) -> list[float] | None:
    vals = [v for v in values if v is not None]
    return [min(vals), max(vals)] if len(vals) > 1 else None


def _relative_spread(values: Iterable[float | None]) -> float | None:
    """How far repetitions of one run differ: (max − min) / median (None below two values)."""
    vals = [v for v in values if v]
    return (max(vals) - min(vals)) / statistics.median(vals) if len(vals) > 1 else None


def _ok(result: dict[str, Any] | None) -> bool:
    return bool(result) and "error" not in result and "skipped" not in result  # type: ignore[operator]


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per framework × workload × method, in the order the runs first appear."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["framework"], run["workload"], method_key(run["method"])), []).append(run)
    rows = []
    for (framework, workload, key), group in groups.items():
        # budget runs (and the long baseline itself) are paired with the baseline of their own length
        base_key = "none-long" if (key.startswith("autockpt-budget") or key == "none-long") \
            and (framework, workload, "none-long") in groups else "none"
        base = {r["rep"]: r["train"] for (f, w, k), g in groups.items() if (f, w, k) == (framework, workload, base_key)
                for r in g if _ok(r["train"])}
        rows.append(_row(framework, workload, key, group, {} if key.startswith("autockpt-ab") else base))
    for row in rows:  # blocked time relative to the framework's synchronous ModelCheckpoint
        ref = next((r for r in rows if (r["framework"], r["workload"], r["method"])
                    == (row["framework"], row["workload"], NATIVE_SYNC.get(row["framework"]))), None)
        if ref and ref.get("blocked_ms") and row.get("blocked_ms") is not None and row["method"] != "none":
            row["blocked_vs_native_sync"] = row["blocked_ms"] / ref["blocked_ms"]
    return rows


def _row(framework: str, workload: str, key: str, group: list[dict[str, Any]], base: dict[int, dict[str, Any]]) -> dict[str, Any]:
    method = group[0]["method"]
    row: dict[str, Any] = {"framework": framework, "workload": workload, "method": key, "label": method_label(method),
                           "kind": "none" if key.startswith("none") else "autockpt" if key.startswith("autockpt") else "native",
                           "budget": method.get("budget"), "repeats": len(group)}
    trains = [r for r in group if _ok(r["train"])]
    problems = [r["train"].get("skipped") or r["train"].get("error") for r in group if not _ok(r["train"])]
    problems += [r["restore"]["error"] for r in group if r.get("restore") and "error" in r["restore"]]
    if problems:
        row["problems"] = sorted(set(str(p) for p in problems))
    if not trains:
        row["skipped"] = next((r["train"].get("skipped") for r in group if r["train"].get("skipped")), None)
        return row
    t0 = trains[0]["train"]
    row.update(params=t0.get("params"), state_bytes=t0.get("state_bytes"), format=t0.get("format"), steps=t0.get("steps"))
    row["step_ms"] = _median(r["train"].get("step_s") for r in trains)
    row["step_ms"] = row["step_ms"] * 1e3 if row["step_ms"] is not None else None
    row["step_spread"] = _relative_spread(r["train"].get("step_s") for r in trains)
    if row["budget"] is not None:  # the noise the budget is judged against
        row["baseline_spread"] = _relative_spread(t.get("step_s") for t in base.values())
    row["step_median_ms"] = (_median(r["train"].get("step_s_median") for r in trains) or 0) * 1e3 or None
    slowdowns = _vs_baseline(trains, base, "step_s")
    row["slowdown"] = _median(slowdowns)
    row["slowdown_spread"] = _spread(slowdowns)
    # the median step, far from most checkpoints: a cost paid in every step shows here
    median_slowdowns = _vs_baseline(trains, base, "step_s_median")
    row["median_step_slowdown"] = _median(median_slowdowns)
    row["median_step_slowdown_spread"] = _spread(median_slowdowns)
    row["hook_ms"] = _ms(_median(r["train"].get("hook_s_median") for r in trains))
    if key.startswith("none"):
        return row
    blocked_all = [b for r in trains for b in r["train"].get("blocked_s", [])]
    firsts = [r["train"]["blocked_s"][0] for r in trains if r["train"].get("blocked_s")]
    row["checkpoints"] = _median(len(r["train"].get("checkpoint_steps", [])) for r in trains)
    row["blocked_ms"] = _ms(_median(blocked_all))
    row["blocked_first_ms"] = _ms(_median(firsts))
    row["blocked_spread_ms"] = [x * 1e3 for x in _spread(blocked_all) or []] or None
    row["save_ms"] = _ms(_median(s for r in trains for s in r["train"].get("save_s", [])))
    row["interval_steps"] = _median(_median(_gaps(r["train"].get("checkpoint_steps", []))) for r in trains)
    row["first_checkpoint_step"] = _median(r["train"]["checkpoint_steps"][0] for r in trains if r["train"].get("checkpoint_steps"))
    row["checkpoint_bytes"] = _median(r["train"].get("checkpoint_bytes") for r in trains)
    row["reported_overhead"] = _median(r["train"].get("reported_overhead") for r in trains)
    row["reported_band"] = _median(r["train"].get("reported_band") for r in trains)
    if key.startswith("autockpt-ab"):
        row.update(_ab_row(trains))
    extra = [r["train"]["peak_rss_bytes"] - base[r["rep"]]["peak_rss_bytes"] for r in trains
             if r["rep"] in base and r["train"].get("peak_rss_bytes") and base[r["rep"]].get("peak_rss_bytes")]
    row["extra_rss_bytes"] = _median(extra)
    restores = [r["restore"] for r in group if _ok(r.get("restore"))]
    if restores:
        row["restore_s"] = _median(r.get("restore_s") for r in restores)
        row["restore_spread_s"] = _spread(r.get("restore_s") for r in restores)
        row["load_s"] = _median(r.get("load_s") for r in restores)
        row["imports_s"] = _median(r.get("imports_s") for r in restores)
        row["skip_s"] = _median(r.get("skip_s") for r in restores)
        # a checkpoint at the run's last step leaves nothing to resume: no exactness to judge from that restore
        judged = [r for r in restores if r.get("resumed_step") is None or row.get("steps") is None
                  or r["resumed_step"] < row["steps"]]
        if judged:
            row["max_abs_diff"] = max(float(r.get("max_abs_diff", float("inf"))) for r in judged)
            row["exact"] = all(bool(r.get("exact")) for r in judged)
        row["resumed_step"] = restores[0].get("resumed_step")
        row["final_step"] = restores[0].get("final_step")
    return row


def _ab_row(trains: list[dict[str, Any]]) -> dict[str, Any]:
    """An A/B row's figures: the cycles of every repetition pooled (mean, and its standard
    error), the in-run meter's view of the same blocks, and the hooks' share of a step, which
    both arms pay and the A/B therefore leaves out (``ab_total`` adds it back)."""
    cycles = [c for r in trains for c in r["train"].get("ab_cycles") or []]
    out: dict[str, Any] = {"every": _median(r["method"].get("every") for r in trains), "ab_cycle_count": len(cycles)}
    out["interval_steps"] = out["every"]  # the gaps between its checkpoints span the off blocks too
    out["ab_overhead"] = statistics.fmean(cycles) if cycles else None
    out["ab_noise"] = statistics.stdev(cycles) / len(cycles) ** 0.5 if len(cycles) > 1 else None
    out["ab_meter_view"] = _median(r["train"].get("ab_meter_view") for r in trains)
    out["ab_reference_spread"] = _median(r["train"].get("ab_reference_spread") for r in trains)
    shares = [r["train"]["hook_s_median"] / r["train"]["step_s_median"] for r in trains
              if r["train"].get("hook_s_median") is not None and r["train"].get("step_s_median")]
    out["ab_hook_share"] = _median(shares)
    if out["ab_overhead"] is not None:
        out["ab_total"] = out["ab_overhead"] + (out["ab_hook_share"] or 0.0)
    out["ab_band"] = ab_band(out["ab_noise"], len(cycles))
    return out


def ab_band(noise: float | None, cycles: int) -> float | None:
    """Half-width of the A/B's 95% band: Student-t over ``cycles − 1`` degrees of freedom times
    the standard error (a few cycles' spread is itself uncertain; 2σ would be too narrow)."""
    return None if noise is None or cycles < 2 else t_quantile(cycles - 1) * noise


def ab_verdict(total: float, band: float | None, budget: float) -> str:
    """"met" when the A/B's 95% band lies at or under the budget, "missed" when it lies over
    it, "below noise" when it holds the budget (or no band exists)."""
    if band is None:
        return "below noise"
    if total + band <= budget:
        return "met"
    return "missed" if total - band > budget else "below noise"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _vs_baseline(trains: list[dict[str, Any]], base: dict[int, dict[str, Any]], field: str) -> list[float]:
    """Each run's ``field`` against its repetition's baseline, as a relative slowdown."""
    return [r["train"][field] / base[r["rep"]][field] - 1 for r in trains
            if r["rep"] in base and r["train"].get(field) and base[r["rep"]].get(field)]


def _gaps(steps: list[int]) -> list[float]:
    return [float(b - a) for a, b in zip(steps, steps[1:])]


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, checked per framework × workload: blocked ≤ 0.2× native sync; slowdown ≤ budget."""
    out = []
    for row in rows:
        if row["method"] == "autockpt" and row.get("blocked_vs_native_sync") is not None:
            out.append({"framework": row["framework"], "workload": row["workload"],
                        "target": f"autockpt blocked ≤ 0.2× {LABELS[NATIVE_SYNC[row['framework']]]}",
                        "measured": f"{row['blocked_ms']:.1f} ms = {row['blocked_vs_native_sync']:.3f}×",
                        "met": row["blocked_vs_native_sync"] <= 0.2})
        if row["method"].startswith("autockpt-budget") and row.get("slowdown") is not None:
            if row.get("interval_steps"):
                how = f"interval {row['interval_steps']:.0f} steps"
            else:  # one checkpoint in the window: the steady-state overhead is lower than measured
                how = f"1 checkpoint in {row.get('steps', '?')} steps: the interval is longer, so this is an upper bound"
            if row.get("reported_overhead") is not None:
                how += f"; autockpt reported {row['reported_overhead'] * 100:.1f}%"
                how += f" ±{row['reported_band'] * 100:.1f}" if row.get("reported_band") is not None else ""
            if row.get("median_step_slowdown") is not None:
                how += f"; median step {row['median_step_slowdown'] * 100:+.1f}%"
            if row.get("hook_ms") is not None:
                how += f", hooks {row['hook_ms']:.2f} ms per step"
            noise = row.get("baseline_spread")
            if noise is not None:
                how += f"; baselines spread {noise * 100:.1f}%"
            verdict = budget_verdict(row["slowdown"], row["budget"], noise)
            out.append({"framework": row["framework"], "workload": row["workload"],
                        "target": f"slowdown ≤ {row['budget'] * 100:g}% budget",
                        "measured": f"{row['slowdown'] * 100:+.1f}% ({how})",
                        "met": verdict == "met", "verdict": verdict})
        if row["method"].startswith("autockpt-ab") and row.get("ab_total") is not None:
            band = f" ±{row['ab_band'] * 100:.1f}" if row.get("ab_band") is not None else ""
            how = f"every {row['every']:.0f} steps, {row['ab_cycle_count']} cycles: checkpoints {row['ab_overhead'] * 100:+.1f}%"
            how += f" + hooks {(row.get('ab_hook_share') or 0) * 100:.1f}%"
            if row.get("ab_meter_view") is not None:
                how += f"; autockpt's meter saw {row['ab_meter_view'] * 100:+.1f}% in the same blocks"
            verdict = ab_verdict(row["ab_total"], row.get("ab_band"), row["budget"])
            out.append({"framework": row["framework"], "workload": row["workload"],
                        "target": f"in-process cost ≤ {row['budget'] * 100:g}% budget",
                        "measured": f"{row['ab_total'] * 100:+.1f}%{band} ({how})",
                        "met": verdict == "met", "verdict": verdict})
    return out


def verdict(target: dict[str, Any]) -> str:
    """A target's result in words: its ``verdict`` where it has one, else "met" or "NOT met"."""
    return str(target.get("verdict") or ("met" if target["met"] else "NOT met"))


def budget_verdict(slowdown: float, budget: float, baseline_spread: float | None) -> str:
    """"met" or "missed"; "below noise" when the baselines' own spread across repetitions is at
    least the budget: this machine cannot tell a slowdown of that size from noise."""
    if baseline_spread is not None and baseline_spread >= budget:
        return "below noise"
    return "met" if slowdown <= budget else "missed"


# -- tables ------------------------------------------------------------------------------------

HEAD = ["framework", "workload", "method", "step ms", "slowdown (spread)", "interval", "blocked ms (first)",
        "÷ native sync", "save ms", "size", "format", "restore s (imports/load/skip)", "extra RAM", "exact resume"]


def _fmt(value: Any, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        if r.get("skipped") or r.get("step_ms") is None:
            out.append([r["framework"], r["workload"], r["label"], "skipped: " + str(r.get("skipped") or r.get("problems"))]
                       + [""] * (len(HEAD) - 4))
            continue
        spread = r.get("slowdown_spread")
        slow = _fmt(r.get("slowdown") * 100 if r.get("slowdown") is not None else None, "+.1f") + "%"
        if spread:
            slow += f" ({spread[0] * 100:+.0f}…{spread[1] * 100:+.0f})"
        if r.get("ab_total") is not None:
            slow = f"A/B {r['ab_total'] * 100:+.1f}%" + (f" ±{r['ab_band'] * 100:.1f}" if r.get("ab_band") else "")
        exact = "-" if "exact" not in r else "yes" if r["exact"] else f"no (max |Δw| {r['max_abs_diff']:.2g})"
        interval = "-" if r["kind"] == "none" else (
            f"{r['interval_steps']:.0f} steps" if r.get("interval_steps") else
            f"1 ckpt at step {r['first_checkpoint_step']:.0f}" if r.get("first_checkpoint_step") else "no checkpoint")
        out.append([
            r["framework"], r["workload"], r["label"], _fmt(r.get("step_ms"), ".1f"),
            "-" if r["kind"] == "none" else slow, interval,
            f"{_fmt(r.get('blocked_ms'), '.1f')} ({_fmt(r.get('blocked_first_ms'), '.0f')})" if r["kind"] != "none" else "-",
            _fmt(r.get("blocked_vs_native_sync"), ".3f"), _fmt(r.get("save_ms"), ".0f"),
            format_size(r["checkpoint_bytes"]) if r.get("checkpoint_bytes") else "-", r.get("format") or "-",
            f"{_fmt(r.get('restore_s'), '.1f')} ({_fmt(r.get('imports_s'), '.1f')}/{_fmt(r.get('load_s'), '.2f')}/"
            f"{_fmt(r.get('skip_s'), '.2f')})" if r.get("restore_s") is not None else "-",
            format_size(max(0, r["extra_rss_bytes"])) if r.get("extra_rss_bytes") is not None else "-", exact,
        ])
    return out


def _reused(src: dict[str, Any]) -> str:
    """How many runs an invocation took from its ``runs.jsonl`` instead of measuring them."""
    n = src.get("reused_runs")
    return f", {n} run(s) reused from an earlier invocation, {src.get('run_s', 0):.0f} s of runs in all" if n else ""


def markdown(results: dict[str, Any]) -> str:
    """``results.md``: machine, command, workloads, the per-method table per framework, targets, plots."""
    m = results["machine"]
    lines = [
        "# autockpt compare: checkpointing in PyTorch/Lightning and TensorFlow/Keras",
        "",
        f"Machine: {m['description']}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in results.get("versions", {}).items()) + ".",
        "",
    ]
    for src in results.get("sources") or [results]:
        s = src["settings"]
        lines += [
            f"- `{src['command']}` ({src['date']}, wall time {src.get('wall_s', 0):.0f} s{_reused(src)}): every method checkpoints "
            f"every {s['every']} steps except the budget runs (interval chosen by autockpt, "
            f"{s.get('budget_window_s', 0):g} s of training each); {s['steps']} steps per run, the first {s['warmup']} "
            f"excluded from step times; {s['threads']} intra-op thread(s); {s['repeats']} repetition(s), medians shown, "
            "spread = min…max over repetitions.",
        ]
    lines += [
        "",
        "| workload | model | parameters | training state |",
        "|---|---|---|---|",
    ]
    for name, w in results["workloads"].items():
        lines.append(f"| {name} | {w['description']} | {w['params'] / 1e6:.2f}M | {format_size(w['state_bytes'])} |")
    lines.append("")
    body = table_rows(results["rows"])
    for framework in results["frameworks"]:
        lines += [f"## {'PyTorch / Lightning' if framework == 'lightning' else 'TensorFlow / Keras'}", ""]
        lines.append("| " + " | ".join(HEAD[1:]) + " |")
        lines.append("|" + "---|" * (len(HEAD) - 1))
        lines += ["| " + " | ".join(r[1:]) + " |" for r in body if r[0] == framework]
        lines.append("")
    if results.get("targets"):
        lines += ["## Targets", "", "| framework | workload | target | measured | result |", "|---|---|---|---|---|"]
        lines += [f"| {t['framework']} | {t['workload']} | {t['target']} | {t['measured']} | {verdict(t)} |"
                  for t in results["targets"]]
        lines.append("")
    lines += [
        "Columns: *step ms* mean step time with checkpoints (median over repetitions); *slowdown* vs no "
        "checkpointing in the same repetition; *blocked ms* median training-thread time per checkpoint "
        "(first checkpoint in brackets); *÷ native sync* blocked ÷ the framework's synchronous ModelCheckpoint; "
        "*save ms* start of a save to its file complete; *size* newest checkpoint on disk; *restore s* new "
        "process to the end of its first trained step (in brackets: the imports of the framework and the method, "
        "the load itself, and the batches drawn without training to reach the checkpoint's position); *extra RAM* peak "
        "RSS above the run without checkpointing; *exact resume* the resumed run's weights at the end vs the "
        "uninterrupted run's. *result* of a budget target: met or missed, or *below noise* where the "
        "baselines' own spread over the repetitions ((max − min) / median of their step times) is at least "
        "the budget, so this machine cannot tell a slowdown that small from noise. *in-process A/B* rows: the "
        "budget run's final interval in one process, checkpoints taken in alternating blocks and held back in "
        "the others (autockpt_bench/study/in_process_ab.py); their *slowdown* column is the cost of those "
        "checkpoints plus the hooks' share of a step, ± a 95% Student-t band over the cycles; their target is met when that band lies at "
        "or under the budget, missed when it lies over it, below noise when it holds the budget.",
        "",
    ]
    for plot in results.get("plots", []):
        lines.append(f"![{plot}]({plot})")
    return "\n".join(lines) + "\n"


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One results dict from several ``results.json`` (e.g. one run per workload, each with its own interval).

    Runs are concatenated (a workload measured in two parts keeps both); rows and targets are recomputed.
    """
    if not parts:
        raise ValueError("nothing to merge")
    out: dict[str, Any] = {
        "machine": parts[0]["machine"], "versions": parts[0].get("versions", {}),
        "date": max(p["date"] for p in parts), "command": " + ".join(p["command"] for p in parts),
        "settings": parts[0]["settings"], "wall_s": sum(p.get("wall_s", 0) for p in parts),
        "sources": [p for q in parts for p in (q.get("sources") or [{k: q[k] for k in ("command", "date", "settings", "wall_s")}])],
        "frameworks": list(dict.fromkeys(f for p in parts for f in p["frameworks"])),
        "workloads": {k: v for p in parts for k, v in p["workloads"].items()},
        "runs": [r for p in parts for r in p["runs"]],
    }
    out["rows"] = summarize(out["runs"])
    out["targets"] = targets(out["rows"])
    return out
