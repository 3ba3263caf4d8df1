"""``python -m autockpt_keras.demo``: kept for scripts that used this entry point.

The demo lives with the other tools, in :mod:`autockpt_core.cli.workers.keras_demo`
(``autockpt demo`` runs it).
"""

from __future__ import annotations

import sys

from autockpt_core.cli.workers.keras_demo import main

__all__ = ["main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
