"""Framework-free training script for the fault harness (contract: see harness.py).

``python -m tests.fault.toy_script DIRPATH OUT [--baseline] [--steps N] [--every K] [--on-preempt exit|continue]``

A numpy linear model trained by SGD. It draws from every global generator autockpt_core
restores: each epoch's order from ``np.random.permutation``, a dropout-like mask from
``np.random.rand`` and a step-size jitter from ``random.random``. It drives a
``CheckpointSession`` itself, which makes it the smallest complete adapter: the order of
calls below (resume_record → restore → start → step_end → save → preemption check → finish)
is the one an adapter follows, and the RNG and preemption parts are what the Keras adapter
wires in the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from typing import IO, Any

import numpy as np

from autockpt_core import CheckpointSession, Config, Preempted, PreemptionHandler, Snapshot, read_tensor_file
from autockpt_core.persist.tensorfile import write_tensor_file
from autockpt_core.rng import capture_rng, restore_rng
from tests.fault.child import FaultPlan, FaultStorage

SAMPLES, FEATURES, BATCH = 64, 6, 8


def data() -> tuple[np.ndarray, np.ndarray]:
    gen = np.random.default_rng(1234)
    x = gen.normal(size=(SAMPLES, FEATURES))
    return x, x @ np.arange(1.0, FEATURES + 1) + 0.1 * gen.normal(size=SAMPLES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dirpath")
    parser.add_argument("out")
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--on-preempt", default="exit")
    args = parser.parse_args(argv)
    plan = FaultPlan.from_env()
    x, y = data()
    batches = SAMPLES // BATCH

    random.seed(0)
    np.random.seed(0)
    w = np.random.normal(size=FEATURES) * 0.1  # the "model initialisation" draws too
    step, epoch, next_batch, order = 0, 0, 0, None

    session: CheckpointSession | None = None
    handler: PreemptionHandler | None = None
    if not args.baseline:
        config = Config(
            dirpath=args.dirpath, every_n_steps=args.every, keep_last=2, on_preempt=args.on_preempt, verbose=False
        )
        storage = FaultStorage(args.dirpath, plan, suffix=".safetensors", half=64)
        session = CheckpointSession(config, framework="toy", suffix=".safetensors", storage=storage)
        record = session.resume_record()
        if record is not None:
            with storage.open_read(record.name) as f:
                arrays, meta = read_tensor_file(f.read())
            w, order = arrays["w"], arrays["order"]
            step, epoch, next_batch = int(meta["step"]), int(meta["epoch"]), int(meta["next_batch"])
            restore_rng(json.loads(meta["rng"]))  # last: nothing draws between here and the next step
        handler = PreemptionHandler(config.signals)
        handler.install()
        session.start(step)

    def snapshot(buffers: Any) -> Snapshot:
        plan.hit("snapshot", step=step)
        w_buf = buffers.get("w", w.shape, w.dtype)
        w_buf[...] = w
        order_buf = buffers.get("order", order.shape, order.dtype)
        order_buf[...] = order
        meta = {"step": str(step), "epoch": str(epoch), "next_batch": str(next_batch), "rng": json.dumps(capture_rng())}

        def write(f: IO[bytes]) -> None:
            write_tensor_file(f, {"w": w_buf, "order": order_buf}, meta)

        return Snapshot(write=write, nbytes=int(w_buf.nbytes + order_buf.nbytes))

    try:
        while step < args.steps:
            if next_batch == 0 or order is None:
                order = np.random.permutation(SAMPLES)
            idx = order[next_batch * BATCH : (next_batch + 1) * BATCH]
            plan.hit("step", step=step)
            mask = (np.random.rand(FEATURES) > 0.2) / 0.8
            pred = x[idx] @ (w * mask)
            grad = x[idx].T @ (pred - y[idx]) / BATCH * mask
            w = w - (0.02 + 0.001 * random.random()) * grad
            step += 1
            next_batch += 1
            if next_batch == batches:
                epoch, next_batch = epoch + 1, 0
            if session is None or handler is None:
                continue
            decision = session.step_end(step, loss=float(np.mean((pred - y[idx]) ** 2)))
            if decision.save:
                session.save(step, epoch, snapshot, reason=decision.reason)
            if handler.requested:  # a signal arrived during this step: checkpoint, then act
                if session.saved_step != step:
                    session.save(step, epoch, snapshot, reason=f"preempted by {handler.signal_name}")
                session.flush()  # durable before we exit
                if config.on_preempt == "exit":
                    raise Preempted(handler.signum or 15, step)
                handler.clear()
        if session is not None:
            session.finish()
    finally:
        if handler is not None:
            handler.uninstall()
    tmp = args.out + ".tmp.npz"
    np.savez(tmp, w=w)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
