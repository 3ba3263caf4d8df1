"""Build the interval adjusters a :class:`~autockpt_core.config.Config` asks for.

Order matters: adaptive re-tuning first (it corrects the uniform interval with measured costs),
then the front-loaded schedule (it reshapes that uniform interval over the run).
"""

from __future__ import annotations

from ..config import Config
from .adaptive import AdaptiveTuner
from .decision import Adjuster
from .frontload import FrontLoadedSchedule


def adjusters_from_config(config: Config) -> list[Adjuster]:
    """``[AdaptiveTuner]`` if ``config.adaptive``, then ``FrontLoadedSchedule`` if front-loaded."""
    out: list[Adjuster] = []
    if config.adaptive:
        out.append(AdaptiveTuner(config))
    if config.schedule == "front_loaded":
        out.append(FrontLoadedSchedule(total_steps=config.total_steps))
    return out
