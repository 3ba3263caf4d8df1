"""Where a command lives: the ``autockpt`` command line (plan, simulate, inspect, bench, demo).

Each subcommand is one module with ``HELP``, ``add_arguments(parser)`` and ``run(args)``;
:mod:`.commands` registers them. The commands may import everything in ``autockpt_core``; nothing
outside this package imports it. Framework code runs only in the worker processes of
:mod:`.workers`, which the commands start with ``python -m``.
"""

from .commands import build_parser, main

__all__ = ["build_parser", "main"]
