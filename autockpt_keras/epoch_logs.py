"""The numbers the Keras callback adds to the epoch logs, and the loss it reads from a batch's logs.

With ``log_metrics=True``, ``on_epoch_end`` adds :data:`LOG_KEYS` to the epoch's logs
(``History``, which Keras runs after the callbacks given, sees them); the driver reads a batch's
loss from its ``logs`` through :func:`loss_in_logs`, only where it needs it. Training thread.
"""

from __future__ import annotations

import math

__all__ = ["LOG_KEYS", "log_values", "loss_in_logs"]

#: Keys added to the epoch logs (and so to ``History``), from ``session.metrics()``.
LOG_KEYS = {
    "autockpt_checkpoints": "autockpt/checkpoints",
    "autockpt_interval_steps": "autockpt/interval_steps",
    "autockpt_stall_ms": "autockpt/stall_ms",
    "autockpt_overhead_pct": "autockpt/overhead_pct",
    "autockpt_overhead_band_pct": "autockpt/overhead_band_pct",
    "autockpt_hook_pct": "autockpt/hook_pct",
}


def log_values(metrics: dict[str, float]) -> dict[str, float]:
    """The ``autockpt_*`` numbers for the logs from the session's metrics (NaN where not measured yet)."""
    return {name: float(metrics.get(source, math.nan)) for name, source in LOG_KEYS.items()}


def loss_in_logs(logs: object) -> float | None:
    """The training loss in a batch's ``logs`` (may read a device value), or None."""
    loss = logs.get("loss") if isinstance(logs, dict) else None
    return float(loss) if loss is not None else None
