"""Finding the frame of the running ``model.fit()`` (Keras has no hook for a ``fit()`` that raises).

``on_train_begin`` records the frame; the preemption handler checks, when a signal arrives,
that this frame is still on the interrupted stack. When it is not, ``fit()`` has ended
without ``on_train_end`` (it raised), so the handler stops deferring signals and hands them
to the previous disposition instead of swallowing them. The callback holds the frame only
while ``fit()`` runs (dropped in ``on_train_end``, when a signal finds it gone, or by the next
``fit()``).
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any


def find_fit_frame(model: Any, max_depth: int = 64) -> FrameType | None:
    """The innermost frame of ``model.fit`` above the caller (training thread), or None."""
    frame = sys._getframe(1)
    depth = 0
    while frame is not None and depth < max_depth:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return frame
        frame = frame.f_back
        depth += 1
    return None


def is_on_stack(target: FrameType, frame: FrameType | None) -> bool:
    """Whether ``target`` is ``frame`` or one of its callers (in a signal handler: the interrupted stack)."""
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False
