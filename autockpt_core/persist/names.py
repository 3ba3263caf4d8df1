"""Checkpoint file names: ``ckpt-step000001200.ckpt``, and ``-v2``, ``-v3`` ... when taken."""

from __future__ import annotations

import re


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
