"""DataLoader workers forked from tf.data's threads exit cleanly on every Python 3.11 and 3.12.

On the TensorFlow backend Keras iterates a torch ``DataLoader`` inside tf.data, in threads
Python did not start. torch's iterator calls ``threading.current_thread()`` there (which makes
a ``threading._DummyThread`` for that thread) and then forks its workers from it. An
interpreter without CPython's fix for gh-102512 (3.11 before 3.11.8, for one) keeps that
``_DummyThread`` as the child's main thread, and ``threading._shutdown`` then fails an
assertion as each worker exits: the worker ran correctly but exits with code 1. torch's
SIGCHLD handler, run in the training thread when any child process ends (autockpt's persist
process, a later loader's worker), then raises "DataLoader worker ... exited unexpectedly with
exit code 1" in whatever that thread was doing, with or without autockpt. Measured on Python
3.11.7: a script of six fits (three resumed) with a 2-worker loader and the callback failed 2
of 8 runs without this handler, 0 of 10 with it.

:func:`install` registers, once per process, an after-fork handler that does in the child what
the fixed interpreters do: the ``_DummyThread`` the fork came from becomes a ``_MainThread``
with its thread-state lock. Where the interpreter has the fix, its own handler (registered
when ``threading`` was imported, so it runs first) has done that already and this one finds
nothing to do.

Call order: :func:`install` from the callback's ``on_train_begin`` (training thread) when
Keras' backend is TensorFlow and the input is a torch ``DataLoader``; the handler runs in
each forked child, on its only thread.
"""

from __future__ import annotations

import os
import threading

_installed = False


def install() -> None:
    """Register :func:`main_thread_after_fork` for forked children (once per process)."""
    global _installed
    if not _installed and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=main_thread_after_fork)
        _installed = True


def main_thread_after_fork() -> None:
    """In a forked child: a ``_DummyThread`` left as the main thread becomes a ``_MainThread``."""
    main = threading.main_thread()
    # CPython's private names of 3.10-3.12; an interpreter without them has its own fix
    dummy, main_class = getattr(threading, "_DummyThread", None), getattr(threading, "_MainThread", None)
    set_lock = getattr(main, "_set_tstate_lock", None)
    if dummy is None or main_class is None or set_lock is None or not isinstance(main, dummy):
        return
    main.__class__ = main_class
    main._name = "MainThread"
    main._daemonic = False  # type: ignore[attr-defined]
    set_lock()


def install_for(backend: str, inputs_kind: str) -> None:
    """A torch ``DataLoader`` on TensorFlow forks its workers from tf.data's threads: install
    the handler there (the callback's ``on_train_begin``), nowhere else."""
    if backend == "tensorflow" and inputs_kind == "torch DataLoader":
        install()
