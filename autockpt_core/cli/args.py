"""Argument helpers shared by ``autockpt plan`` and ``autockpt simulate``.

Every helper raises ``ValueError`` with a one-line message naming the flag, which
``cli.commands.main`` prints and turns into exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from ..config import Config
from ..errors import ConfigError
from ..policy.profiler import Estimates
from ..units import parse_duration, parse_fraction

#: Config field -> command-line flag, to name the flag in error messages.
FLAGS = {
    "overhead_budget": "--budget",
    "mtbf": "--mtbf",
    "min_interval": "--min-interval",
    "max_interval": "--max-interval",
    "total_steps": "--total-steps",
}


def add_cost_arguments(parser: argparse.ArgumentParser, mtbf_required: bool = False) -> None:
    """The flags both commands take: iteration time, stall, persist, MTBF (``simulate`` needs
    it), budget, bounds."""
    parser.add_argument("--iter-time", required=True, help="time of one optimizer step, e.g. 350ms")
    parser.add_argument("--stall", required=True, help="training time blocked per checkpoint, e.g. 120ms")
    parser.add_argument("--persist", default="0s", help="background persist time per checkpoint, e.g. 2s")
    parser.add_argument("--slowdown", default=None,
                        help="measured slowdown of the steps a persist overlaps, e.g. 10%% (default: not measured, "
                             "so the budget counts the whole persist time, as the runtime does until it has measured it)")
    if mtbf_required:
        parser.add_argument("--mtbf", required=True, help="mean time between failures, e.g. 6h")
    else:
        parser.add_argument("--mtbf", default=None, help="mean time between failures, e.g. 6h (enables Young/Daly)")
    parser.add_argument("--budget", default="2%", help="overhead budget, e.g. 2%% or 0.02 (default 2%%)")
    parser.add_argument("--min-interval", default=None, help="never checkpoint more often than this, e.g. 30s")
    parser.add_argument("--max-interval", default=None, help="never go longer than this without one, e.g. 30min")
    parser.add_argument("--total-steps", type=int, default=None, help="optimizer steps of the whole run")
    parser.add_argument(
        "--loss-curve",
        default=None,
        help="loss curve file: one loss per line, or 'step,loss' pairs (CSV/TSV/spaces; '#' comments "
        "and a header row are skipped), or a JSON list of losses or [step, loss] pairs",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def rounded(value: object, digits: int = 6) -> object:
    """``value`` with every float rounded to ``digits`` significant digits, for JSON output
    (``0.35`` rather than ``0.35000000000000003``); dicts, lists and tuples are walked."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def duration(flag: str, text: str, *, allow_zero: bool = False) -> float:
    """Seconds from a human duration; names ``flag`` on bad input."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{flag} must be {'>= 0' if allow_zero else 'positive'}, got {text!r}")
    return seconds


def budget(flag: str, text: str) -> float:
    """An overhead budget in (0, 1) from "2%" or "0.02"; names ``flag`` on bad input."""
    try:
        value = parse_fraction(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None
    if not 0 < value < 1:
        raise ValueError(f"{flag} must be between 0% and 100%, got {text!r}")
    return value


def config_from_args(args: argparse.Namespace, **overrides: object) -> Config:
    """A :class:`Config` from the cost flags (the runtime's own validation, flag names in errors)."""
    values: dict[str, object] = {
        "dirpath": ".",
        "overhead_budget": args.budget,
        "mtbf": args.mtbf,
        "min_interval": args.min_interval,
        "max_interval": args.max_interval,
        "total_steps": args.total_steps,
    }
    values.update(overrides)
    try:
        return Config.from_dict(values)
    except ConfigError as exc:
        raise ValueError(f"{FLAGS.get(exc.field, exc.field)}: {exc}") from None


def estimates_from_args(args: argparse.Namespace) -> Estimates:
    """The profiler estimates the runtime would have measured, from the flags (``--slowdown``:
    as if measured over many loaded iterations without spread)."""
    t = duration("--iter-time", args.iter_time)
    est = Estimates(
        iter_time_s=t,
        stall_s=duration("--stall", args.stall, allow_zero=True),
        persist_s=duration("--persist", args.persist, allow_zero=True),
    )
    if getattr(args, "slowdown", None) is None:
        return est
    try:
        slowdown = parse_fraction(args.slowdown)
    except ValueError as exc:
        raise ValueError(f"--slowdown: {exc}") from None
    if slowdown < 0:
        raise ValueError(f"--slowdown must be >= 0, got {args.slowdown!r}")
    return dataclasses.replace(est, loaded_iter_time_s=t * (1.0 + slowdown), loaded_iterations=1000, loaded_sd_s=0.0)


def read_loss_curve(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, losses) from a text or JSON file; see ``--loss-curve`` for the formats."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--loss-curve: no such file: {path}")
    text = file.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--loss-curve: {path} is not valid JSON: {exc}") from None
        rows = [r if isinstance(r, list) else [r] for r in data]
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.replace(",", " ").replace("\t", " ").split()
            try:
                rows.append([float(f) for f in fields])
            except ValueError:
                if rows:  # only a first (header) row may be non-numeric
                    raise ValueError(f"--loss-curve: {path} line {n} is not numeric: {line!r}") from None
    if not rows:
        raise ValueError(f"--loss-curve: {path} holds no losses")
    widths = {len(r) for r in rows}
    if widths == {1}:
        losses = np.array([r[0] for r in rows], dtype=float)
        return np.arange(losses.size, dtype=float), losses
    if widths == {2}:
        arr = np.array(rows, dtype=float)
        return arr[:, 0], arr[:, 1]
    raise ValueError(f"--loss-curve: {path} needs one column (loss) or two (step, loss) on every line")
