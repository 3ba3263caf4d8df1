"""PNG plots of ``autockpt compare`` and ``autockpt goodput`` (matplotlib, Agg backend).

Each function takes the rows of :mod:`.report` (or the goodput methods) and writes one file;
missing values are left out of a plot, never drawn as zero.
"""

from __future__ import annotations

from typing import Any


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ValueError("plots need matplotlib: pip install 'autockpt[plot]' (or pass --no-plots)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


MARKERS = {"autockpt": "o", "native": "s"}


def slowdown_vs_interval(rows: list[dict[str, Any]], frameworks: list[str], path: str) -> None:
    """Per framework: slowdown (%) vs checkpoint interval (steps), one colour per workload."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(frameworks), figsize=(6 * len(frameworks), 4.2), squeeze=False)
    for ax, framework in zip(axes[0], frameworks):
        for i, workload in enumerate(dict.fromkeys(r["workload"] for r in rows)):
            color = f"C{i}"
            for r in rows:
                if (r["framework"], r["workload"]) != (framework, workload) or r.get("slowdown") is None:
                    continue
                if r["kind"] == "none" or not r.get("interval_steps"):
                    continue
                ax.plot(r["interval_steps"], 100 * r["slowdown"], MARKERS[r["kind"]], color=color, alpha=0.85)
                ax.annotate(r["method"].replace("autockpt-budget-", "").replace("modelcheckpoint", "MC"),
                            (r["interval_steps"], 100 * r["slowdown"]), fontsize=6, xytext=(3, 2), textcoords="offset points")
            ax.plot([], [], "-", color=color, label=workload)
        ax.plot([], [], "o", color="0.3", label="autockpt")
        ax.plot([], [], "s", color="0.3", label="native")
        ax.axhline(0, color="0.7", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("checkpoint interval (steps)")
        ax.set_ylabel("slowdown vs no checkpointing (%)")
        ax.set_title(framework)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def blocked_vs_size(rows: list[dict[str, Any]], path: str) -> None:
    """Blocked time per checkpoint (ms) vs training-state size, one line per framework × method."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["kind"] == "none" or r["method"].startswith("autockpt-budget") or not r.get("blocked_ms") or not r.get("state_bytes"):
            continue
        name = "autockpt (fixed interval)" if r["method"] == "autockpt" else r["label"]  # one line across intervals
        series.setdefault(f"{r['framework']}: {name}", []).append((r["state_bytes"], r["blocked_ms"]))
    for i, (label, points) in enumerate(sorted(series.items())):
        points.sort()
        style = "-o" if "autockpt" in label else "--s"
        ax.plot([p[0] / 1e6 for p in points], [p[1] for p in points], style, color=f"C{i % 10}", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training state (MB)")
    ax.set_ylabel("blocked time per checkpoint (ms)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def size_per_format(rows: list[dict[str, Any]], path: str) -> None:
    """Checkpoint size on disk ÷ training-state bytes, per format and workload."""
    plt = _pyplot()
    kept = [r for r in rows if r.get("checkpoint_bytes") and r.get("state_bytes") and not r["method"].startswith("autockpt-budget")]
    labels = list(dict.fromkeys(f"{r['framework']}: {r['format']} ({r['label']})" for r in kept))
    workloads = list(dict.fromkeys(r["workload"] for r in kept))
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(4, len(labels)) + 1))
    height = 0.8 / max(1, len(workloads))
    for j, workload in enumerate(workloads):
        for i, label in enumerate(labels):
            r = next((r for r in kept if r["workload"] == workload and f"{r['framework']}: {r['format']} ({r['label']})" == label), None)
            if r:
                ax.barh(i + j * height, r["checkpoint_bytes"] / r["state_bytes"], height, color=f"C{j}",
                        label=workload if i == 0 or not ax.get_legend_handles_labels()[1].count(workload) else None)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(labels))])
    ax.set_yticklabels(labels, fontsize=7)
    ax.axvline(1.0, color="0.6", lw=0.8)
    ax.set_xlabel("checkpoint size ÷ training state (params + Adam moments)")
    handles, names = ax.get_legend_handles_labels()
    uniq = dict(zip(names, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def goodput_per_method(runs: list[dict[str, Any]], path: str) -> None:
    """Per framework: wall time ÷ failure-free time per method, measured and simulated."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 0.4 * max(len(r["methods"]) for r in runs) + 2), squeeze=False)
    for ax, run in zip(axes[0], runs):
        methods = run["methods"]
        names = [m["name"] for m in methods]
        y = range(len(methods))
        measured = [m.get("slowdown_factor") or 0 for m in methods]
        ax.barh([i - 0.2 for i in y], measured, 0.4, label="measured", color="C0")
        predicted = [m.get("predicted", {}).get("slowdown_factor") for m in methods]
        ax.barh([i + 0.2 for i, p in zip(y, predicted) if p], [p for p in predicted if p], 0.4, label="simulator (expected, measured costs)", color="C1")
        ax.set_yticks(list(y))
        ax.set_yticklabels(names, fontsize=7)
        ax.axvline(1.0, color="0.6", lw=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("wall time to finish ÷ failure-free time without checkpointing")
        ax.set_title(f"{run['framework']}, MTBF {run['mtbf_s']:g} s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
