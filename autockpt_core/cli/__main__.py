"""``python -m autockpt_core.cli``: the same as the ``autockpt`` command."""

import sys

from .commands import main

sys.exit(main())
