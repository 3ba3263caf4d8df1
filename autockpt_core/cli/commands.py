"""The core's commands, the parser and the dispatch (``python -m autockpt_core.cli``); the
``autockpt`` command adds the study's (:mod:`autockpt_bench.cli`). Each is a module of this package.

``autockpt inspect DIR``  list the checkpoints in DIR with step, time, size and checksum status.
``autockpt plan``         the checkpoint interval each policy gives for stated costs, and autockpt's choice.
``autockpt simulate``     compare checkpoint policies under simulated failures (table and PNG plot).
``autockpt status DIR``   what stopping the job that writes DIR would cost now (its status file).

Errors (:func:`main`): a user's error is one line on stderr, ``autockpt COMMAND: error: MESSAGE``,
and a non-zero exit: 2 for a usage or setting error (``ValueError``, ``ConfigError``), 1 for one
met while running (``OSError``, another ``AutockptError``). An object store's error names its
cause and fix (:mod:`autockpt_core.persist.storage_errors`); a command on an ``s3://`` DIR
checks it with one quick request before it runs. ``--debug`` (before or after the command) shows
the traceback instead; any other exception (a bug) always does.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from typing import Callable, Mapping, NoReturn, Sequence

from ..errors import AutockptError
from ..persist.storage import storage_for
from ..persist.storage_errors import check_reachable, diagnose
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


DEBUG_HELP = "on an error, show the traceback instead of one line"


class _Parser(argparse.ArgumentParser):
    """A usage error is one line (the command, the problem, where the usage is), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(commands: Mapping[str, Command] = COMMANDS) -> argparse.ArgumentParser:
    parser = _Parser(prog="autockpt", description="Automatic checkpointing for deep learning.")
    parser.add_argument("--version", action="version", version=f"autockpt {_version()}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (add_arguments, _run, help_text) in commands.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(command)
        # SUPPRESS: left out, it keeps the top-level value instead of resetting it to False
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def _version() -> str:
    try:
        return metadata.version("autockpt")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "(not installed)"


def main(argv: Sequence[str] | None = None, commands: Mapping[str, Command] = COMMANDS) -> int:
    """Parse ``argv``, run the command, return the exit status; a user's error is one line on
    stderr (see the module's docstring), re-raised instead with ``--debug``."""
    parser = build_parser(commands)
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version (0) or a usage error (2, its line printed)
        return done.code if isinstance(done.code, int) else 2
    _add, run, _help = commands[args.command]
    try:
        _check_location(args)
        return run(args)
    except Exception as exc:
        message = user_error(exc)
        if message is None or args.debug:
            raise
        print(f"autockpt {args.command}: error: {message}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1


def user_error(exc: BaseException) -> str | None:
    """The one line for an error of the user's input, settings or environment: an object store's
    with its cause and fix (:func:`~autockpt_core.persist.storage_errors.diagnose`), a
    ``ValueError``, ``OSError`` or ``AutockptError`` as its message; None for anything else (a bug)."""
    found = diagnose(exc)
    if found is not None and not isinstance(exc, AutockptError):  # autockpt's own already say it
        text = found.sentence()
    elif isinstance(exc, (ValueError, OSError, AutockptError)):
        text = str(exc) or type(exc).__name__
    else:
        return None
    return " ".join(text.split())  # one line, whatever the message holds


def _check_location(args: argparse.Namespace) -> None:
    """A command on an object store URL (``args.dirpath``, with ``args.storage_options`` where the
    command takes them) first sends it one quick request
    (:func:`~autockpt_core.persist.storage_errors.check_reachable`): a wrong endpoint fails at
    once, a missing bucket is named. Local directories are left to the command."""
    dirpath = getattr(args, "dirpath", None)
    if isinstance(dirpath, str) and "://" in dirpath:
        check_reachable(storage_for(dirpath, getattr(args, "storage_options", None)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
