"""Fault-injection tests with real processes: SIGKILL at chosen phases, SIGTERM, corrupt files.

``harness.py`` (parent side) and ``child.py`` (inside the training script) are framework-neutral;
see ``harness.py`` for the script contract the Keras tests can reuse.
"""
