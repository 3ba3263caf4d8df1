"""What the per-step agreement costs a Keras job on JAX over 2 processes (``jax.distributed``).

Every optimizer step, AutoCheckpoint's processes agree (process 0's checkpoint decision, any
process's signal and failure, the slowest process's step and checkpoint times) through one
``process_allgather`` of the six float64 numbers' bytes (two, counting the one that sends the
lengths; ``autockpt_keras/processes.py``). This script trains an MLP under a
``keras.distribution.DataParallel`` over both processes' CPU devices (gloo on 127.0.0.1, each
process its own half of the data) for ``--steps`` steps, ``--rounds`` times in alternating
order: without the callback, and with it but no checkpoint in the timed steps
(``every_n_steps`` beyond the run, no final checkpoint), so the difference is the agreement and
the per-step profiling (each round's mean step time from step 20 to the epoch's end; the
median over rounds is reported). It also times every agreement on process 0. Prints a table and
writes ``--json`` (process 0).

    python examples/jax_agreement_overhead.py --steps 300 --rounds 3 --json agreement.json

Process 0 starts process 1 by running this same command with ``AUTOCKPT_BENCH_PROCESS`` set.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from agreement_report import report  # examples/ (the script's directory is on sys.path)

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
PROCESS_ENV = "AUTOCKPT_BENCH_PROCESS"  # "<process id>:<port>" in process 1


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--json", default=None)
    return parser.parse_args()


def start_processes() -> tuple[int, subprocess.Popen[bytes] | None]:
    """This process's id; process 0 starts process 1 and joins it through jax.distributed."""
    peer = None
    if PROCESS_ENV in os.environ:
        process_id, _, port = os.environ[PROCESS_ENV].partition(":")
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            process_id, port = "0", str(s.getsockname()[1])
        peer = subprocess.Popen([sys.executable, *sys.argv], env=dict(os.environ, **{PROCESS_ENV: f"1:{port}"}))
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))
    return int(process_id), peer


def main() -> int:
    args = parse()
    process_id, peer = start_processes()
    import jax
    import keras
    import numpy as np

    from autockpt_keras import AutoCheckpoint
    from autockpt_keras.processes import JaxProcesses

    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False))
    agree_s: list[float] = []
    original_agree = JaxProcesses.agree

    def timed_agree(self: JaxProcesses, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original_agree(self, **kwargs)
        finally:
            agree_s.append(time.perf_counter() - start)

    JaxProcesses.agree = timed_agree  # type: ignore[method-assign]

    class StepTimes(keras.callbacks.Callback):
        """The mean step time from batch 20's end to the epoch's end (this process; never reads
        self.model). Not per-step gaps: without a callback that reads the loss, JAX dispatches
        steps ahead of their computation, and only the epoch's end waits for all of them."""

        def __init__(self) -> None:
            super().__init__()
            self.start: float | None = None
            self.mean_s = 0.0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 20:
                self.start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:  # after fit() fetched the logs
            assert self.start is not None
            self.mean_s = (time.perf_counter() - self.start) / (args.steps - 21)

    rng = np.random.default_rng(process_id)
    x = rng.normal(size=(32 * args.steps, 64)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    root = tempfile.mkdtemp(prefix="jax-agreement-")

    def fit(method: str) -> tuple[float, list[float]]:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((64,))
        hidden = keras.layers.Dense(args.width, activation="relu")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
        model.compile(optimizer="adam", loss="mse")
        timer = StepTimes()
        callbacks: list[Any] = [timer]
        if method == "autockpt":
            auto = AutoCheckpoint(
                os.path.join(root, method), every_n_steps=10 * args.steps, save_on_train_end=False,
                verbose=False, resume=False,
            )
            callbacks.insert(0, auto)
        del agree_s[:]
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks)
        return timer.mean_s, list(agree_s[20:])

    steps: dict[str, list[float]] = {"none": [], "autockpt": []}
    calls: list[float] = []
    for round_ in range(args.rounds):
        for method in (["none", "autockpt"] if round_ % 2 == 0 else ["autockpt", "none"]):
            mean_s, agreed = fit(method)
            steps[method].append(mean_s)
            calls.extend(agreed)
    jax.distributed.shutdown()  # a barrier: both processes leave together
    if peer is not None:
        peer.wait()
    if process_id != 0:
        return 0
    facts = {
        "machine": f"{os.cpu_count()} CPUs, jax {jax.__version__}, keras {keras.__version__}",
        "processes": 2,
        "collectives": "gloo (jax_cpu_collectives_implementation)",
        "steps": args.steps,
        "rounds": args.rounds,
        "width": args.width,
    }
    title = "Keras on JAX, 2 processes (jax.distributed, gloo): the per-step agreement"
    report(title, steps, calls, facts, args.json, step_column="mean step ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
