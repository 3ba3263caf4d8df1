"""The framework's own checkpointing beside autockpt in one ``fit()``: what its saves cost, and
a load of weights that replaces autockpt's resumed state.

An adapter names the methods of a framework object that such saves and loads go through
(Lightning: ``trainer.save_checkpoint``, which ``ModelCheckpoint`` calls; Keras: ``model.save``
and ``model.save_weights``, which ``ModelCheckpoint`` and ``BackupAndRestore`` call, and
``model.load_weights``, ``BackupAndRestore``'s restore at train start). Call order, all on the
training thread:

    others.watch(owner, saves=(...), loads=(...), resumed=...)   # at fit() start
    ...                                  # the wrapped methods time each save; a load after
                                         # ``resumed()`` returned a step warns (ResumeNotExactWarning)
    others.release()                     # at fit() end: the methods are the owner's again

:meth:`watch` sets the wrappers as instance attributes (the class's methods are untouched); a
wrapper left by a fit that raised before :meth:`release` only forwards, and the next
:meth:`watch` replaces it. autockpt's own checkpoints never go through these methods.
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import Any, Callable, Iterable

from .errors import ResumeNotExactWarning

_ORIGINAL = "__autockpt_original__"


class OtherCheckpoints:
    """Saves (count, seconds) and loads seen through the watched methods."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.saves = 0
        self.save_s = 0.0
        self.what = ""  # who saves, for the summary: "Lightning's ModelCheckpoint"
        self._clock = clock
        self._wrapped: list[tuple[Any, str, Any]] = []  # (owner, name, the instance's own attribute or None)
        self._resumed: Callable[[], int | None] = lambda: None

    def watch(self, owner: Any, saves: Iterable[str] = (), loads: Iterable[str] = (), *, what: str = "",
              resumed: Callable[[], int | None] | None = None) -> None:
        """Wrap ``owner``'s methods ``saves`` (timed) and ``loads`` (a load once ``resumed()``
        gives a step warns that it replaces that state); ``what`` names who saves."""
        self.what = what or self.what
        if resumed is not None:
            self._resumed = resumed
        for name in saves:
            self._wrap(owner, name, self._timed)
        for name in loads:
            self._wrap(owner, name, self._checked_load)

    def release(self) -> None:
        """Put every wrapped method back (idempotent)."""
        for owner, name, own in reversed(self._wrapped):
            if own is None:
                try:
                    object.__delattr__(owner, name)
                except AttributeError:  # already gone
                    pass
            else:
                object.__setattr__(owner, name, own)
        self._wrapped.clear()

    def _wrap(self, owner: Any, name: str, kind: Callable[[str, Callable[..., Any]], Callable[..., Any]]) -> None:
        current = getattr(owner, name, None)
        if not callable(current):
            return
        original = getattr(current, _ORIGINAL, current)  # a wrapper left by a fit that raised
        own = vars(owner).get(name) if hasattr(owner, "__dict__") else None
        if own is not None and hasattr(own, _ORIGINAL):
            own = None  # ours, left over: removing it is putting the method back
        wrapper = kind(name, original)
        setattr(wrapper, _ORIGINAL, original)
        object.__setattr__(owner, name, wrapper)  # past a framework's attribute tracking (Keras layers)
        self._wrapped.append((owner, name, own))

    def _timed(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self._clock()
            try:
                return original(*args, **kwargs)
            finally:
                self.saves += 1
                self.save_s += self._clock() - start

        return timed

    def _checked_load(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def checked(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            step = self._resumed()
            if step is not None:
                source = f"({args[0]!r})" if args else ""
                warnings.warn(
                    f"autockpt: {name}{source} ran after autockpt resumed step {step} in this fit (Keras' "
                    "BackupAndRestore restores at train start too): the weights it loaded replace the resumed "
                    "ones, so the run does not continue exactly from that step. Fix: remove BackupAndRestore "
                    "from callbacks; autockpt already resumes, mid-epoch included",
                    ResumeNotExactWarning,
                    stacklevel=2,
                )
            return result

        return checked
