"""``python -m autockpt_keras.demo --dirpath D --budget 2%``: see the policy work on a small model.

Trains an MLP on synthetic regression data (numpy, generated here) with :class:`AutoCheckpoint`
on the current Keras backend (``KERAS_BACKEND``), and prints what was measured and decided:
each checkpoint's step, reason, interval and stall as it happens, the profiler's estimates and
the summary line at the end. Every number printed is measured in this run. Rerunning with the
same ``--dirpath`` resumes from the newest checkpoint and trains ``--epochs`` more epochs.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any, Sequence

import keras
import numpy as np

from autockpt_core import Preempted
from autockpt_core.units import format_size
from autockpt_keras import AutoCheckpoint, latest_checkpoint, load_checkpoint


def build_model(width: int, features: int) -> Any:
    keras.utils.set_random_seed(0)  # seeded shuffling: a rerun after a kill resumes exactly
    model = keras.Sequential(
        [
            keras.Input((features,), name="x"),
            keras.layers.Dense(width, activation="relu", name="dense_in"),
            keras.layers.Dense(width, activation="relu", name="dense_mid"),
            keras.layers.Dropout(0.1, name="dropout"),
            keras.layers.Dense(1, name="dense_out"),
        ],
        name="demo_mlp",
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3, name="adam"), loss="mse", metrics=["mae"])
    return model


def synthetic_data(samples: int, features: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, features)).astype("float32")
    w = rng.normal(size=(features, 1)).astype("float32")
    y = np.tanh(x @ w) + 0.1 * rng.normal(size=(samples, 1)).astype("float32")
    return x, y.astype("float32")


class _Reporter(keras.callbacks.Callback):
    """Prints each new checkpoint the AutoCheckpoint callback took, and one line per epoch."""

    def __init__(self, auto: AutoCheckpoint) -> None:
        super().__init__()
        self.auto = auto
        self.printed = 0

    def on_train_begin(self, logs: Any = None) -> None:
        info = self.auto.restored
        if info is not None:
            print(f"  resumed from {info.path} (step {info.step}), continuing with epoch {info.next_epoch + 1}",
                  flush=True)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._print_new()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        logs = logs or {}
        parts = [f"epoch {epoch + 1}: loss {logs.get('loss', math.nan):.4f}"]
        for key in ("autockpt_checkpoints", "autockpt_interval_steps", "autockpt_stall_ms", "autockpt_overhead_pct"):
            value = logs.get(key, math.nan)
            parts.append(f"{key}={'n/a' if math.isnan(value) else f'{value:.3g}'}")
        print("  " + ", ".join(parts), flush=True)

    def on_train_end(self, logs: Any = None) -> None:
        self._print_new()

    def _print_new(self) -> None:
        for event in self.auto.events[self.printed :]:
            interval = f"{event.interval_steps} steps ({event.interval_rule})" if event.interval_steps else "n/a"
            print(
                f"  checkpoint at step {event.step} (epoch {event.epoch + 1}): {event.reason}; "
                f"interval {interval}; stall {event.stall_s * 1e3:.2f} ms for {format_size(event.nbytes)}",
                flush=True,
            )
        self.printed = len(self.auto.events)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autockpt_keras.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--dirpath", default="autockpt-demo/keras", help="checkpoint directory")
    parser.add_argument("--budget", default="2%", help="overhead budget, e.g. 2%% or 0.02")
    parser.add_argument("--epochs", type=int, default=4, help="epochs to train in this run")
    parser.add_argument("--width", type=int, default=512, help="hidden width (sets the checkpoint size)")
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--mtbf", default=None, help="mean time between failures, e.g. 6h (optional)")
    args = parser.parse_args(argv)

    features = 64
    auto = AutoCheckpoint(args.dirpath, overhead_budget=args.budget, mtbf=args.mtbf, verbose=False, log_metrics=True)
    start_epoch = 0
    if latest_checkpoint(args.dirpath) is not None:
        start_epoch = load_checkpoint(args.dirpath)[1].next_epoch
    epochs = start_epoch + args.epochs
    model = build_model(args.width, features)
    x, y = synthetic_data(args.samples, features)
    print(
        f"autockpt demo: Keras {keras.__version__}, backend {keras.backend.backend()}, "
        f"{model.count_params():,} parameters, {math.ceil(args.samples / args.batch_size)} steps/epoch, "
        f"epochs {start_epoch + 1}..{epochs}, budget {auto.config.overhead_budget:.2%}, dirpath {args.dirpath}",
        flush=True,
    )
    began = time.perf_counter()
    try:
        model.fit(x, y, batch_size=args.batch_size, epochs=epochs, verbose=0, callbacks=[auto, _Reporter(auto)])
    except Preempted as stop:  # Ctrl-C: the checkpoint of the step is committed
        print(stop.describe(args.dirpath), flush=True)
        return int(stop.code)  # type: ignore[arg-type]  # 128 + the signal's number
    wall = time.perf_counter() - began
    session = auto.session
    assert session is not None and auto.summary is not None
    est = session.estimates()
    ms = lambda s: "n/a" if s is None else f"{s * 1e3:.2f} ms"  # noqa: E731
    print("measured:", flush=True)
    print(f"  iteration time {ms(est.iter_time_s)} (median after warm-up), stall {ms(est.stall_s)}, "
          f"persist {ms(est.persist_s)}, checkpoint {format_size(est.checkpoint_bytes or 0)}", flush=True)
    if est.background_slowdown is not None:
        print(f"  iterations overlapping a persist were {est.background_slowdown:.1%} slower", flush=True)
    if session.policy.current is not None:
        print(f"decided: interval {session.policy.current.explain()}", flush=True)
    if auto.events:
        stalls = [e.stall_s * 1e3 for e in auto.events]
        print(f"  stall per checkpoint: min {min(stalls):.2f} ms, median {float(np.median(stalls)):.2f} ms, "
              f"max {max(stalls):.2f} ms over {len(stalls)} checkpoints; fit() took {wall:.1f} s", flush=True)
    print(auto.summary.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
