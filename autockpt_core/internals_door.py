"""One door for a framework's private names: a table, lookups that give None, one report, one undo stack.

An adapter that needs a framework's private attributes for exact resume keeps every such name
in one table of :class:`Internal` entries (``autockpt_lightning.internals``,
``autockpt_keras.internals``) and reads them only through :func:`lookup`, so a release that
renames or removes one gives the caller :data:`MISSING`, never an ``AttributeError`` in the
middle of a save or a resume. At the fit's start the adapter collects the entries its
framework lacks and hands them to :func:`report_missing`: a missing name the adapter cannot
work without (``required``) is an :class:`~autockpt_core.errors.AutockptError` naming it
before anything trains; any other is one
:class:`~autockpt_core.errors.ResumeNotExactWarning` (or, where exactness is not at stake, a
log warning) that says what is off without it.

What an adapter swaps on a framework's objects for the duration of a fit (a wrapped method, a
stand-in train function, a start epoch) goes through one :class:`PatchStack`, which puts each
back (or removes the instance attribute it added) when the swap ends, or all of them when the
fit ends or raises.

No framework imports: the tables and the objects come from the adapters.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import AutockptError, ResumeNotExactWarning

log = logging.getLogger("autockpt")

MISSING: Any = object()
"""What :func:`lookup` gives for a name the object does not have."""


@dataclasses.dataclass(frozen=True)
class Internal:
    """One private name: what holds it, its name, what autockpt loses without it, and whether
    autockpt can run at all without it (``required``) or resume exactly (``exactness``)."""

    owner: str
    attr: str
    needed_for: str
    required: bool = False
    exactness: bool = True  # without it a resume may not be exact (a ResumeNotExactWarning)

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.attr}"


def lookup(table: Mapping[str, Internal], obj: Any, key: str) -> Any:
    """``obj``'s attribute for ``table[key]``; :data:`MISSING` where ``obj`` has no such name."""
    return getattr(obj, table[key].attr, MISSING)


def absent(table: Mapping[str, Internal], holders: Iterable[tuple[Any, Iterable[str]]]) -> list[Internal]:
    """The entries of ``table`` whose holder (``(object, keys)`` pairs) lacks the name."""
    return [table[key] for obj, keys in holders for key in keys if lookup(table, obj, key) is MISSING]


def report_missing(gone: Iterable[Internal], release: str, *, stacklevel: int = 3) -> None:
    """At the fit's start: refuse a ``release`` without a required internal (naming it), warn
    once about those without which a resume may not be exact, log the others."""
    gone = list(dict.fromkeys(gone))
    if not gone:
        return
    fix = (
        f"Fix: install a release the README's 'Supported versions' lists, and report {release} "
        "(the canaries: python -m pytest tests/compat)."
    )
    required = [i for i in gone if i.required]
    if required:
        names = "; ".join(f"{i.label} ({i.needed_for})" for i in required)
        raise AutockptError(f"autockpt cannot run on {release}: it has no {names}. {fix}")
    inexact = [i for i in gone if i.exactness]
    if inexact:
        names = "; ".join(f"{i.label}: {i.needed_for}" for i in inexact)
        warnings.warn(
            f"autockpt: {release} has no {names}. Resuming mid-epoch may not be exact without it. {fix}",
            ResumeNotExactWarning,
            stacklevel=stacklevel,
        )
    for i in gone:
        if not i.exactness:
            log.warning("autockpt: %s has no %s; off without it: %s", release, i.label, i.needed_for)


@dataclasses.dataclass(eq=False)
class Patch:
    """One swapped attribute: the value put there, and what was there before (an instance
    attribute, or none: the class's then showed through)."""

    obj: Any
    attr: str
    value: Any
    had_own: bool
    previous: Any


class PatchStack:
    """What one fit swapped on framework objects, to put back.

    Call order: :meth:`set` while the fit runs (the training thread); :meth:`undo` when one
    swap ends before the fit (a skip that is over; any thread: a data loader's thread may end
    it); :meth:`undo_all` at the fit's end, or at the next fit's start after one that raised.
    A swap someone else replaced since is left as they left it.
    """

    def __init__(self) -> None:
        self._patches: list[Patch] = []
        self._lock = threading.Lock()

    def set(self, obj: Any, attr: str, value: Any) -> Patch:
        own = getattr(obj, "__dict__", {})
        patch = Patch(obj, attr, value, attr in own, own.get(attr))
        with self._lock:
            setattr(obj, attr, value)
            self._patches.append(patch)
        return patch

    def undo(self, patch: Patch | None) -> None:
        """Put back what ``patch`` replaced (no-op for None or a patch already undone)."""
        with self._lock:
            if patch is None or not any(p is patch for p in self._patches):
                return
            self._patches = [p for p in self._patches if p is not patch]
            if getattr(patch.obj, patch.attr, MISSING) is not patch.value:
                return
            if patch.had_own:
                setattr(patch.obj, patch.attr, patch.previous)
            elif patch.attr in getattr(patch.obj, "__dict__", {}):
                delattr(patch.obj, patch.attr)

    def undo_all(self) -> None:
        for patch in reversed(list(self._patches)):
            self.undo(patch)

    def __len__(self) -> int:
        return len(self._patches)
