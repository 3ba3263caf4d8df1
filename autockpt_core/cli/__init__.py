"""Where a command lives: the ``autockpt`` command line (inspect, plan, simulate, bench, demo,
compare, goodput).

Each subcommand is one module with ``HELP``, ``add_arguments(parser)`` and ``run(args)``;
:mod:`.commands` registers them. The commands may import everything in ``autockpt_core``.
Framework code runs only in the worker processes of :mod:`.workers`, which the commands start
with ``python -m``; the adapters' ``demo`` modules run the demo workers in-process.
"""

from .commands import build_parser, main

__all__ = ["build_parser", "main"]
