"""``autockpt plan``: the interval each policy gives for stated costs, and the one autockpt picks.

The choice comes from :func:`~autockpt_core.policy.decision.choose_interval`, the function the runtime
calls, fed with the estimates the profiler would have measured. With ``--loss-curve`` (and an
MTBF) it also shows the front-loaded schedule the runtime would follow with
``schedule="front_loaded"``, computed by the same :mod:`~autockpt_core.policy.frontload` functions.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from rich.console import Console
from rich.table import Table

from ..config import Config
from ..policy.decision import IntervalChoice, IntervalRules, choose_interval
from ..policy.frontload import MAX_STRETCH, ValueModel, horizon_for, schedule_steps
from ..policy.losscurve import fit_loss_curve
from ..units import format_duration
from ..policy.profiler import Estimates
from .args import add_cost_arguments, config_from_args, estimates_from_args, read_loss_curve, rounded

HELP = "show the checkpoint interval of each policy for given costs, and the one autockpt chooses"



def describe(rule: str, cost_s: float, est: Estimates, config: Config) -> str:
    """What ``rule`` computed, with the figures it used (``cost_s``: the cost per checkpoint the
    choice used, the same for every rule of one choice)."""
    cost = format_duration(cost_s)
    mtbf = format_duration(config.mtbf) if config.mtbf is not None else "?"
    return {
        "budget": f"overhead budget: {cost} per checkpoint / interval <= {config.overhead_budget:.3g}",
        "persist": f"after the previous persist finished ({format_duration(float(est.persist_s or 0.0))})",
        "young": f"Young: sqrt(2 * {cost} * MTBF {mtbf})",
        "daly": f"Daly (2006) higher-order optimum at {cost}, MTBF {mtbf}",
        "min_interval": "--min-interval",
        "max_interval": "--max-interval",
    }.get(rule, rule)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cost_arguments(parser)


def plan(config: Config, args: argparse.Namespace) -> dict[str, Any]:
    """Everything ``plan`` prints, as a JSON-ready dict."""
    est = estimates_from_args(args)
    choice = choose_interval(IntervalRules.of(config), est)
    t = float(est.iter_time_s)  # type: ignore[arg-type]
    cost = float(choice.cost_s or 0.0)
    policies = {
        name: {"steps": steps, "seconds": steps * t, "what": describe(name, cost, est, config)}
        for name, steps in choice.candidates.items()
    }
    out: dict[str, Any] = {
        "inputs": {
            "iter_time_s": t,
            "stall_s": est.stall_s,
            "persist_s": est.persist_s,
            "mtbf_s": config.mtbf,
            "budget": config.overhead_budget,
            "total_steps": config.total_steps,
        },
        "cost_per_checkpoint_s": cost,
        "policies": policies,
        "chosen_interval_s": choice.seconds,
        "chosen_interval_steps": choice.steps,
        "rule": choice.rule,
        "reason": choice.explain(),
        "front_loaded": None,
    }
    if args.loss_curve:
        out["front_loaded"] = front_loaded_plan(config, choice, args.loss_curve, t)
    return out


def front_loaded_plan(config: Config, choice: IntervalChoice, path: str, iter_time_s: float) -> dict[str, Any]:
    """The front-loaded schedule for a recorded loss curve, or why it falls back to uniform."""
    steps, losses = read_loss_curve(path)
    fit = fit_loss_curve(steps, losses)
    info: dict[str, Any] = {"fit": fit.describe(), "active": False, "reason": fit.reason}
    if not fit.ok:
        return info
    if "daly" not in choice.candidates:
        info["reason"] = "needs --mtbf to weigh progress against failures"
        return info
    assert fit.curve is not None
    model = ValueModel(fit.curve, horizon_for(fit, config.total_steps))
    cands = choice.candidates
    lo = max(cands[r] for r in ("budget", "persist", "min_interval") if r in cands)
    hi = cands.get("max_interval", math.inf)
    ckpts = schedule_steps(model, cands["daly"], lo, hi, MAX_STRETCH)
    gaps = [b - a for a, b in zip([0, *ckpts], ckpts)] or [int(model.horizon)]
    info.update(
        active=True,
        reason="",
        horizon_steps=model.horizon,
        checkpoints=len(ckpts),
        uniform_checkpoints=max(0, math.ceil(model.horizon / cands["daly"]) - 1),
        first_interval_steps=gaps[0],
        median_interval_steps=sorted(gaps)[len(gaps) // 2],
        last_interval_steps=gaps[-1],
        first_interval_s=gaps[0] * iter_time_s,
        last_interval_s=gaps[-1] * iter_time_s,
    )
    return info


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    out = plan(config, args)
    if args.json:
        print(json.dumps(rounded(out), indent=1))
        return 0
    console = Console(width=120)
    table = Table(title="autockpt plan: checkpoint interval per policy")
    for col in ("policy", "steps", "interval", "rule"):
        table.add_column(col, justify="right" if col in ("steps", "interval") else "left")
    for name, row in out["policies"].items():
        mark = " <- chosen" if name == out["rule"] else ""
        table.add_row(name + mark, str(row["steps"]), format_duration(row["seconds"]), row["what"])
    fl = out["front_loaded"]
    if fl is not None and fl["active"]:
        table.add_row(
            "front_loaded",
            f"{fl['first_interval_steps']}..{fl['last_interval_steps']}",
            f"{format_duration(fl['first_interval_s'])}..{format_duration(fl['last_interval_s'])}",
            f"{fl['checkpoints']} checkpoints over {fl['horizon_steps']:.0f} steps "
            f"(uniform: {fl['uniform_checkpoints']})",
        )
    console.print(table)
    say = lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    say(f"chosen: {out['reason']}")
    if fl is not None:
        say(f"loss curve: {fl['fit']}")
        if not fl["active"]:
            say(f"front-loaded schedule: off, uniform interval kept ({fl['reason']})")
        else:
            say("with schedule='front_loaded' the runtime shortens early and lengthens late "
                "intervals as in the front_loaded row")
    return 0
