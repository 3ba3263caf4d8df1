"""The running ``fit()``, watched from outside its hooks: signal handlers and the session.

Keras calls no hook when ``fit()`` raises in a step or in another callback. :class:`FitGuard`
holds the running ``fit()``'s frame (:mod:`autockpt_keras.fit_frame`) for two things that must
not outlive it: the preemption handler, which hands a signal to the previous handler once that
frame is gone, and a :class:`~autockpt_keras.fit_watch.FitWatch`, which releases the session
then.

Call order (training thread): ``FitGuard(config)`` in ``on_train_begin`` (its ``preemption``
goes to the driver), ``start(model, driver, session)`` once the checkpoint is restored,
``stop_watch()`` when ``fit()`` ends through ``on_train_end``, ``stop_signals()`` when it ends
either way. The handler's check runs in the signal handler (main thread). ``start`` also has
the session time Keras' own saves of the model in this fit (``ModelCheckpoint``,
``BackupAndRestore``: ``model.save``/``save_weights``, in the summary) and warn when a
``model.load_weights`` replaces the resumed weights (:mod:`autockpt_core.other_checkpoints`;
the summary at the fit's end puts the methods back).
"""

from __future__ import annotations

import functools
import threading
from types import FrameType
from typing import Any, Callable, TypeVar, cast

from autockpt_core import CheckpointSession, Config
from autockpt_core.fit_driver import FitDriver
from autockpt_core.preemption_sources import preemption_for

from .fit_frame import find_fit_frame, is_on_stack
from .fit_watch import FitWatch

__all__ = ["FitGuard", "ends_fit_on_error"]

_Hook = TypeVar("_Hook", bound=Callable[..., None])


def ends_fit_on_error(hook: _Hook) -> _Hook:
    """A callback hook that raises ends this ``fit()`` for autockpt before the exception leaves it.

    Keras has no hook for a ``fit()`` that raises, so the signal handlers and the session
    (with its directory lock) are released here (the callback's ``_end_failed_fit``):
    ``fit()`` is about to raise this exception.
    """

    @functools.wraps(hook)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except BaseException:
            self._end_failed_fit()
            raise

    return cast(_Hook, wrapper)


class FitGuard:
    """One ``fit()``'s frame, its preemption handler (None without ``signals``) and its watch."""

    def __init__(self, config: Config | None = None) -> None:
        self._frame: FrameType | None = None
        self._watch: FitWatch | None = None
        self.preemption = preemption_for(config, alive=self._running) if config is not None else None

    def start(self, model: Any, driver: FitDriver, session: CheckpointSession | None) -> None:
        """Find ``fit()``'s frame, watch it (process 0, which has the ``session``:
        ``driver.abandon`` once it is gone without ``on_train_end``), watch Keras' own saves and
        loads of ``model`` (see the module docstring), and install the handlers."""
        self._frame = find_fit_frame(model)
        if self._frame is not None and session is not None:
            self._watch = FitWatch(self._frame, threading.get_ident(), driver.abandon)
            self._watch.start()
        if session is not None:
            session.ledger.others.watch(model, saves=("save", "save_weights"), loads=("load_weights",),
                                        what="Keras' own checkpointing", resumed=lambda: driver.resumed_from)
        if self.preemption is not None:
            self.preemption.install()

    def stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None

    def stop_signals(self) -> None:
        if self.preemption is not None:
            self.preemption.uninstall()
        self._frame = None

    def stop(self) -> None:
        self.stop_watch()
        self.stop_signals()

    def _running(self, frame: FrameType | None) -> bool:
        """In the signal handler: whether the ``fit()`` this guard serves is on the stack."""
        fit_frame = self._frame
        if fit_frame is None or is_on_stack(fit_frame, frame):
            return True  # its frame was not found at on_train_begin: it is taken to be running
        self._frame = None
        return False


_T = TypeVar("_T")


def set_by_fit(value: _T | None) -> _T:
    """``value``, which ``on_train_begin`` sets: a hook that runs before it is not ``fit()``'s."""
    if value is None:
        raise RuntimeError("AutoCheckpoint hooks ran before on_train_begin; use it through model.fit().")
    return value
