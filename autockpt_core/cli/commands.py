"""The ``autockpt`` command line: the parser and dispatch. Each subcommand is a module of this package.

``autockpt inspect DIR``  list the checkpoints in DIR with step, time, size and checksum status.
``autockpt demo``         train small synthetic models with Lightning and Keras (needs extras).
``autockpt plan``         the checkpoint interval each policy gives for stated costs, and autockpt's choice.
``autockpt simulate``     compare checkpoint policies under simulated failures (table and PNG plot).
``autockpt bench``        snapshot stall, persist throughput, memory and training slowdown vs the
                          physical limits and Lightning's/Keras' checkpointing (frameworks run in
                          subprocesses).
``autockpt compare``      the framework study: small/medium/large workloads in Lightning and Keras,
                          no checkpointing vs native checkpointing vs autockpt (tables, JSON, PNGs).
``autockpt goodput``      real processes SIGKILLed at seeded exponential times, rerun until done:
                          wall time per checkpointing method, beside the simulator's prediction.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from . import bench as cli_bench
from . import compare as cli_compare
from . import demo as cli_demo
from . import goodput as cli_goodput
from . import inspect as cli_inspect
from . import plan as cli_plan
from . import simulate as cli_simulate

# name -> (register arguments, run, help)
Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]
COMMANDS: dict[str, Command] = {
    "inspect": (cli_inspect.add_arguments, cli_inspect.run, cli_inspect.HELP),
    "demo": (cli_demo.add_arguments, cli_demo.run, cli_demo.HELP),
    "plan": (cli_plan.add_arguments, cli_plan.run, cli_plan.HELP),
    "simulate": (cli_simulate.add_arguments, cli_simulate.run, cli_simulate.HELP),
    "bench": (cli_bench.add_arguments, cli_bench.run, cli_bench.HELP),
    "compare": (cli_compare.add_arguments, cli_compare.run, cli_compare.HELP),
    "goodput": (cli_goodput.add_arguments, cli_goodput.run, cli_goodput.HELP),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autockpt", description="Automatic checkpointing for deep learning.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (add_arguments, _run, help_text) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _add, run, _help = COMMANDS[args.command]
    try:
        return run(args)
    except ValueError as exc:  # bad input: one clear line, exit 2
        print(f"autockpt {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
