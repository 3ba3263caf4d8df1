"""Checkpoint file names: ``ckpt-step000001200.ckpt``, and ``-v2``, ``-v3`` ... when taken."""

from __future__ import annotations

import re
from typing import Callable


def checkpoint_name(step: int, suffix: str, version: int = 1) -> str:
    """File name of the checkpoint after ``step``: ``ckpt-step000001200.ckpt``.

    ``version`` > 1 gives ``ckpt-step000001200-v2.ckpt``, used when an earlier run (e.g. one
    started with ``resume=False``) already left a file of that name: it is never overwritten.
    """
    tail = f"-v{version}" if version > 1 else ""
    return f"ckpt-step{step:09d}{tail}{suffix}"


def is_checkpoint_name(name: str, suffix: str) -> bool:
    """True for the names :func:`checkpoint_name` gives with ``suffix`` (and only those)."""
    return re.fullmatch(r"ckpt-step\d{9,}(-v\d+)?" + re.escape(suffix), name) is not None


def free_name(name: str, taken: Callable[[str], bool]) -> str:
    """``name``, or the first ``-v2``, ``-v3`` ... variant of it that ``taken`` says is free.

    For copies between tiers (:mod:`.tiers`): a checkpoint keeps its name where it can, and
    never overwrites another file. Names not of :func:`checkpoint_name`'s form get the
    version before their last suffix.
    """
    if not taken(name):
        return name
    match = re.fullmatch(r"(ckpt-step\d{9,})(?:-v(\d+))?(\..*)?", name)
    if match is not None:
        head, version, tail = match.group(1), int(match.group(2) or 1), match.group(3) or ""
    else:
        head, dot, ext = name.rpartition(".")
        head, version, tail = (head, 1, f".{ext}") if dot and head else (name, 1, "")
    while True:
        version += 1
        candidate = f"{head}-v{version}{tail}"
        if not taken(candidate):
            return candidate
