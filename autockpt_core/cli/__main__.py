"""``python -m autockpt_core.cli``: the core's commands (inspect, plan, simulate)."""

import sys

from .commands import main

sys.exit(main())
