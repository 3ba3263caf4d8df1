"""``python -m autockpt_lightning.demo``: kept for scripts that used this entry point.

The demo lives with the other tools, in :mod:`autockpt_core.cli.workers.lightning_demo`
(``autockpt demo`` runs it).
"""

from __future__ import annotations

import sys

from autockpt_core.cli.workers.lightning_demo import main

__all__ = ["main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
