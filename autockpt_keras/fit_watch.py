"""Noticing a ``fit()`` that raised outside autockpt's hooks (Keras calls no hook then).

A ``fit()`` that raises in a step or in another callback skips ``on_train_end``; in a notebook
the exception's traceback then keeps the callback, its session and the directory lock alive,
and a new callback on the same ``dirpath`` gets ``DirectoryLockedError``. :class:`FitWatch`
releases them: a daemon thread wakes every ``interval`` seconds and looks whether the running
``fit()``'s frame is still on the training thread's stack (``sys._current_frames``); once it is
gone, it calls ``on_gone()``, once, in the watch thread.

Call order: ``start()`` in ``on_train_begin``, ``stop()`` (training thread) in ``on_train_end``
or when one of autockpt's hooks raises; after ``stop()`` returns, ``on_gone`` is not called.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import FrameType
from typing import Callable

from .fit_frame import is_on_stack

INTERVAL_S = 0.5

log = logging.getLogger("autockpt")


class FitWatch:
    """Calls ``on_gone()`` once ``frame`` has left thread ``thread_id``'s stack; see the module docstring."""

    def __init__(self, frame: FrameType, thread_id: int, on_gone: Callable[[], None], interval: float = INTERVAL_S) -> None:
        self._frame: FrameType | None = frame
        self._thread_id = thread_id
        self._on_gone = on_gone
        self._interval = interval
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # stop() and the call of on_gone() exclude each other
        self._thread = threading.Thread(target=self._run, name="autockpt-fit-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
            self._frame = None

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            where = self._left_at()
            if where is None:
                continue
            with self._lock:
                if self._stopped.is_set():
                    return
                self._stopped.set()
                self._frame = None
            log.warning("autockpt: fit() left the training thread without on_train_end (its stack is now at %s); "
                        "releasing the session and the directory lock", where)
            self._on_gone()
            return

    def _left_at(self) -> str | None:
        """None while ``fit()``'s frame is on the training thread's stack, else where that stack is.

        The training thread's frames are referenced only inside this call. Were the loop to hold
        them while it waits, a ``fit()`` that has returned or raised could have its last reference
        here, and its locals (a TensorFlow iterator) would be freed in this daemon thread, at the
        latest while the interpreter finalizes: TensorFlow aborts the process then.
        """
        frame = self._frame
        top = sys._current_frames().get(self._thread_id)
        if frame is not None and top is not None and is_on_stack(frame, top):
            return None
        return "no frame" if top is None else f"{top.f_code.co_name} ({top.f_code.co_filename}:{top.f_lineno})"
