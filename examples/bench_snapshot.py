"""Snapshot/persist benchmark: ``python examples/bench_snapshot.py --sizes 10MB,100MB``.

The same as ``autockpt bench`` (see ``autockpt_bench/bench.py``): prints the tables,
writes ``autockpt-bench.json`` (``--json``) and, with ``--markdown FILE``, the tables as
Markdown. Each configuration runs in its own subprocess (frameworks are imported there).
"""

from __future__ import annotations

import sys

from autockpt_bench.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
