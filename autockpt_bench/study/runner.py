"""Start one study worker process for a case and read its result back (see :mod:`.protocol`).

Called from the command's thread; each call blocks until the worker exits (or times out). The
worker's output goes to a log file next to its spec, so a failure is reported with its last
lines and the whole log stays for reading.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..workers.measure import FIXED_ALLOCATOR, thread_caps
from .protocol import WORKERS, write_spec
from .workloads import Workload

PACKAGES = ("autockpt_core", "autockpt_torch", "autockpt_lightning", "autockpt_keras", "autockpt_bench")


def compile_packages() -> None:
    """Byte-compile autockpt's packages, as installing them does (call once, before the workers).

    Every worker then loads autockpt the way it loads the frameworks, from compiled files, also
    from a source checkout and where ``PYTHONDONTWRITEBYTECODE`` is set: otherwise each worker
    would compile autockpt's modules again (about 0.05 s of every restart on the project's CPU
    machine) and no native method would pay the like. A directory that cannot be written is
    left as it is.
    """
    import compileall
    import importlib.util

    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        for directory in (spec.submodule_search_locations or []) if spec is not None else []:
            compileall.compile_dir(directory, quiet=2)


def worker_env(threads: int, keras_backend: str | None = None) -> dict[str, str]:
    """The environment of a worker: quiet frameworks, pinned threads, the Keras backend, and
    glibc's allocator with fixed thresholds (:data:`FIXED_ALLOCATOR`; values already in the
    environment win)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    env.update(thread_caps(threads))
    for name, value in FIXED_ALLOCATOR.items():
        env.setdefault(name, value)
    if keras_backend:
        env["KERAS_BACKEND"] = keras_backend
    return env


def command(framework: str, case: str, spec_path: str | os.PathLike[str], workers: dict[str, str] | None = None) -> list[str]:
    module = (workers or WORKERS)[framework]
    return [sys.executable, "-m", module, case, "--spec", str(spec_path)]


def run_case(
    framework: str,
    case: str,
    workload: Workload,
    method: dict[str, Any],
    workdir: str | os.PathLike[str],
    tag: str,
    *,
    timeout: float,
    threads: int,
    keras_backend: str = "tensorflow",
    workers: dict[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Run ``case`` in a fresh interpreter; the worker's result dict, or ``{"error": ...}``.

    ``workdir/tag.spec.json`` gets the spec, ``tag.result.json`` the result, ``tag.log`` the
    output. ``fields`` go into the spec (``dir``, ``steps``, ``warmup``, ``reference``, ...).
    """
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out, log = work / f"{tag}.spec.json", work / f"{tag}.result.json", work / f"{tag}.log"
    out.unlink(missing_ok=True)
    started = time.time()  # restore_s counts from here: the spec is written right before the spawn
    write_spec(spec_path, workload, method, out=str(out), threads=threads, keras_backend=keras_backend,
               started_at=started, **fields)
    cmd = command(framework, case, spec_path, workers)
    with open(log, "w", encoding="utf-8") as logf:
        try:
            proc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, env=worker_env(threads, keras_backend),
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f}s", "log": str(log)}
    wall = time.time() - started
    if proc.returncode != 0 or not out.exists():
        tail = " | ".join(log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-4:])
        return {"error": f"exit status {proc.returncode}: {tail}", "log": str(log)}
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    result["process_wall_s"] = wall
    return result
