"""Timing a method of a running job from outside: the one wrapper every study worker uses.

Call order: :func:`wrap_call` before ``fit()`` (or from a hook that runs before the calls to
time); the wrapper then runs on whatever thread calls the method (the training thread for
hooks, the writer thread for a persist).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

__all__ = ["After", "log_calls", "wrap_call"]

After = Callable[[float, tuple[Any, ...], Any], None]
"""``after(seconds, args, result)``: the call's wall time, its positional arguments, and what it
returned (None when it raised)."""


def wrap_call(obj: Any, name: str, *, before: Callable[..., None] | None = None, after: After | None = None) -> None:
    """Replace ``obj.name`` by: ``before(*args, **kwargs)``, the original call, timed, then
    ``after(seconds, args, result)``, also when the call raised (the exception goes on)."""
    original = getattr(obj, name)

    @functools.wraps(original)  # keeps its signature for code that inspects it
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(*args, **kwargs)
        out = None
        start = time.perf_counter()
        try:
            out = original(*args, **kwargs)
            return out
        finally:
            if after is not None:
                after(time.perf_counter() - start, args, out)

    setattr(obj, name, wrapped)


def log_calls(obj: Any, names: tuple[str, ...], log: list[tuple[float, float]]) -> None:
    """Each call of ``obj``'s methods ``names`` appends (start, seconds) to ``log``
    (``time.perf_counter()`` times)."""
    for name in names:
        wrap_call(obj, name, after=lambda seconds, args, out: log.append((time.perf_counter() - seconds, seconds)))
