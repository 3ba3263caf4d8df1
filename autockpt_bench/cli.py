"""The ``autockpt`` command: the core's commands (:mod:`autockpt_core.cli`: inspect, plan,
simulate) and the study's.

``autockpt bench``        snapshot stall, persist throughput, memory and training slowdown vs the
                          physical limits and Lightning's/Keras' checkpointing (frameworks run in
                          subprocesses).
``autockpt demo``         train small synthetic models with Lightning and Keras (needs extras).
``autockpt compare``      the framework study: small/medium/large workloads in Lightning and Keras,
                          no checkpointing vs native checkpointing vs autockpt (tables, JSON, PNGs).
``autockpt goodput``      real processes SIGKILLed at seeded exponential times, rerun until done:
                          wall time per checkpointing method, beside the simulator's prediction.
``autockpt export``       one checkpoint of a directory as a file that loads without autockpt:
                          Lightning .ckpt, Keras .weights.h5 or .keras, or .safetensors.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from autockpt_core.cli import commands as core

from . import bench, compare, demo, export, goodput

COMMANDS: dict[str, core.Command] = {
    **core.COMMANDS,
    "demo": (demo.add_arguments, demo.run, demo.HELP),
    "bench": (bench.add_arguments, bench.run, bench.HELP),
    "compare": (compare.add_arguments, compare.run, compare.HELP),
    "goodput": (goodput.add_arguments, goodput.run, goodput.HELP),
    "export": (export.add_arguments, export.run, export.HELP),
}


def build_parser() -> argparse.ArgumentParser:
    return core.build_parser(COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    return core.main(argv, COMMANDS)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
