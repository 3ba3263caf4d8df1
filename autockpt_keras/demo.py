"""``python -m autockpt_keras.demo``: the Keras demo (``autockpt demo`` runs it too), whose
code is :mod:`autockpt_core.cli.workers.keras_demo`.
"""

from __future__ import annotations

import sys

from autockpt_core.cli.workers.keras_demo import main

__all__ = ["main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
