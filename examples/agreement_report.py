"""The report both agreement benchmarks print and write (``ddp_agreement_overhead.py``,
``jax_agreement_overhead.py``): median step time without and with the callback, and the
agreement calls' median and 90th percentile."""

from __future__ import annotations

import json
import statistics
from typing import Any


def report(
    title: str,
    steps: dict[str, list[float]],
    calls: list[float],
    facts: dict[str, Any],
    json_path: str | None,
    step_column: str = "median step ms",
) -> dict[str, Any]:
    """``steps``: each round's step time of "none" and "autockpt" (the median over rounds is
    reported); ``calls``: every timed agreement (seconds); ``facts``: the run's settings, first
    in the JSON. Prints a table, writes ``json_path`` (if given), returns the result."""
    none, auto = statistics.median(steps["none"]), statistics.median(steps["autockpt"])
    result = {
        **facts,
        "median_step_s": {"none": none, "autockpt": auto},
        "per_round_median_step_s": steps,
        "slowdown": auto / none - 1.0,
        "agree_call_s": {
            "median": statistics.median(calls),
            "p90": statistics.quantiles(calls, n=10)[-1],
            "calls": len(calls),
        },
    }
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("method", step_column, "vs none", "agree() median µs", "agree() p90 µs"):
        table.add_column(column, justify="right")
    table.add_row("none", f"{none * 1e3:.2f}", "", "", "")
    table.add_row(
        "autockpt (no checkpoint)",
        f"{auto * 1e3:.2f}",
        f"{(auto / none - 1) * 100:+.1f}%",
        f"{result['agree_call_s']['median'] * 1e6:.0f}",
        f"{result['agree_call_s']['p90'] * 1e6:.0f}",
    )
    Console().print(table)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return result
