"""The core's commands, the parser and the dispatch (``python -m autockpt_core.cli``); the
``autockpt`` command adds the study's (:mod:`autockpt_bench.cli`). Each is a module of this package.

``autockpt inspect DIR``  list the checkpoints in DIR with step, time, size and checksum status.
``autockpt plan``         the checkpoint interval each policy gives for stated costs, and autockpt's choice.
``autockpt simulate``     compare checkpoint policies under simulated failures (table and PNG plot).
``autockpt status DIR``   what stopping the job that writes DIR would cost now (its status file).
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from typing import Callable, Mapping, NoReturn, Sequence

from . import inspect as cli_inspect
from . import plan as cli_plan
from . import simulate as cli_simulate
from . import status as cli_status

# name -> (register arguments, run, help)
Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]
COMMANDS: dict[str, Command] = {
    "inspect": (cli_inspect.add_arguments, cli_inspect.run, cli_inspect.HELP),
    "plan": (cli_plan.add_arguments, cli_plan.run, cli_plan.HELP),
    "simulate": (cli_simulate.add_arguments, cli_simulate.run, cli_simulate.HELP),
    "status": (cli_status.add_arguments, cli_status.run, cli_status.HELP),
}


class _Parser(argparse.ArgumentParser):
    """A usage error is one line (the command, the problem, where the usage is), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(commands: Mapping[str, Command] = COMMANDS) -> argparse.ArgumentParser:
    parser = _Parser(prog="autockpt", description="Automatic checkpointing for deep learning.")
    parser.add_argument("--version", action="version", version=f"autockpt {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (add_arguments, _run, help_text) in commands.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def _version() -> str:
    try:
        return metadata.version("autockpt")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "(not installed)"


def main(argv: Sequence[str] | None = None, commands: Mapping[str, Command] = COMMANDS) -> int:
    parser = build_parser(commands)
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version (0) or a usage error (2, its line printed)
        return done.code if isinstance(done.code, int) else 2
    _add, run, _help = commands[args.command]
    try:
        return run(args)
    except ValueError as exc:  # bad input: one clear line, exit 2
        print(f"autockpt {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
