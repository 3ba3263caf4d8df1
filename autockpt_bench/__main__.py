"""``python -m autockpt_bench``: the ``autockpt`` command."""

import sys

from .cli import main

sys.exit(main())
