"""Run the ``autockpt`` console script the package installs, as a user's shell would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: The console entry point installed beside this interpreter (``pip install -e .``).
AUTOCKPT = str(Path(sys.executable).parent / "autockpt")


def autockpt(*args: str, cwd: str | os.PathLike[str] | None = None, timeout: float = 300,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``autockpt ARGS`` in a child process; stdout and stderr are pipes (not a terminal)."""
    return subprocess.run([AUTOCKPT, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
