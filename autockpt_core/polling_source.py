"""The thread a polling source of preemption runs in: look, wait, look again, until it asked.

:class:`PollingSource` is the part the deadline (:mod:`autockpt_core.deadline`) and the cloud
notice (:mod:`autockpt_core.cloud_notice`) share: ``start(request)`` runs :meth:`check` in a
daemon thread of its own until it returns True (it asked) or :meth:`stop` is called, waiting
:meth:`wait_s` between two looks. Subclasses give ``name`` (who asks), ``thread_name``,
``join_timeout_s``, :meth:`check` and :meth:`wait_s`. Base: no framework, no other core module.

Threading: ``start`` and ``stop`` on the training thread (the handler's install and uninstall);
``check`` and ``wait_s`` on the source's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Request = Callable[[int, str], None]


class PollingSource:
    name = "source"
    thread_name = "autockpt-source"
    join_timeout_s = 5.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self, request: Request) -> bool:
        """One look: call ``request(signum, self.name)`` when the job must stop; True once it did."""
        raise NotImplementedError

    def wait_s(self) -> float:
        """Seconds until the next look."""
        raise NotImplementedError

    def start(self, request: Request) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(request,), name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.join_timeout_s)

    def _run(self, request: Request) -> None:
        while not self._stop.is_set():
            if self.check(request):
                return
            self._stop.wait(self.wait_s())
