"""Where a core command lives: ``python -m autockpt_core.cli`` (inspect, plan, simulate); the
``autockpt`` command adds the study's commands (:mod:`autockpt_bench.cli`).

Each subcommand is one module with ``HELP``, ``add_arguments(parser)`` and ``run(args)``;
:mod:`.commands` registers them. The commands may import everything in ``autockpt_core``;
nothing but the command lines (this package and ``autockpt_bench``) imports this package.
"""

from .commands import build_parser, main

__all__ = ["build_parser", "main"]
