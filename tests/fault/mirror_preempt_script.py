"""A job with a node-local ``dirpath`` and an S3 mirror, preempted while the mirror is unreachable.

    python -m tests.fault.mirror_preempt_script DIRPATH MIRROR_URL ENDPOINT

Drives a ``CheckpointSession`` as an adapter does (every 5 steps a checkpoint; a signal is acted
on at the next step boundary through ``commit_emergency``, then the run exits 128 + n). Prints
``mirrored`` once the first checkpoint is in the mirror; the test then takes the S3 server down
(killed, or stopped so that connections hang) and sends SIGTERM.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from autockpt_core import CheckpointSession, Config, Preempted, PreemptionHandler, Snapshot, write_tensor_file
from autockpt_core.emergency import commit_emergency


def main(dirpath: str, mirror: str, endpoint: str, grace: str | None = None) -> int:
    wait: dict[str, Any] = {"mirror_preempt_wait": 3} if grace is None else {"grace_period": grace}
    config = Config(
        dirpath=dirpath, mirror=mirror, every_n_steps=5, verbose=True, **wait,
        storage_options={"endpoint_url": endpoint, "key": "testing", "secret": "testing",
                         "config_kwargs": {"connect_timeout": 2, "read_timeout": 60, "retries": {"max_attempts": 1}}},
    )  # fmt: skip
    session = CheckpointSession(config, framework="np", suffix=".safetensors")
    handler = PreemptionHandler(config.signals)
    handler.install()
    w = np.zeros(1 << 20, dtype=np.float32)  # 4 MiB of state
    session.start(0)
    said = False

    def snapshot(pool: Any) -> Snapshot:
        buf = pool.get("w", w.shape, w.dtype)
        buf[...] = w
        return Snapshot(write=lambda f: write_tensor_file(f, {"w": buf}), nbytes=buf.nbytes)

    try:
        for step in range(1, 100_000):
            w += 1.0
            time.sleep(0.02)
            decision = session.step_end(step)
            if decision.save:
                session.save(step, 0, snapshot)
            if not said and session.mirror is not None and session.mirror.mirrored:
                print("mirrored", flush=True)
                said = True
            if handler.requested:
                if session.saved_step != step:
                    session.save(step, 0, snapshot, reason="preempted")
                commit_emergency(session, step, handler.signum or 15, on_preempt="exit", verbose=True,
                                 received_at=handler.received_at)
                raise Preempted(handler.signum or 15, step)  # a SystemExit: exit status 128 + n
    finally:
        handler.uninstall()
        session.close()  # as the adapters do on their way out of fit()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
