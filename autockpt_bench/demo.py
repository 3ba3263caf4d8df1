"""``autockpt demo``: the main job on built-in synthetic data, in both frameworks.

Runs ``python -m autockpt_lightning.demo`` and ``python -m autockpt_keras.demo`` in fresh
subprocesses (each framework in its own interpreter, Keras' backend chosen per run). Each prints
what the policy measured and decided. Ctrl-C reaches the running demo (the terminal signals the
whole process group): it commits a checkpoint of its step and exits 130; this command waits for
that instead of killing it, and starts no further demo.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

HELP = "train small synthetic models with Lightning and Keras using autockpt (needs the extras)"

FRAMEWORKS = {
    "lightning": ["-m", "autockpt_lightning.demo"],
    "keras": ["-m", "autockpt_keras.demo"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dirpath", default="autockpt-demo", help="where the demo writes checkpoints (default autockpt-demo)")
    parser.add_argument(
        "--framework", choices=sorted(FRAMEWORKS) + ["both"], default="both", help="which framework to run"
    )
    parser.add_argument("--budget", default="2%", help="overhead budget (default 2%%)")
    parser.add_argument("--steps", type=int, default=None,
                        help="Lightning: optimizer steps in all (max_steps; default 500); a rerun with the same "
                        "--dirpath resumes and trains up to this")
    parser.add_argument("--epochs", type=int, default=None,
                        help="Keras: epochs to train in this run (default 4); a rerun resumes and trains this many more")
    parser.add_argument("--keras-backend", default=os.environ.get("KERAS_BACKEND", "tensorflow"),
                        help="Keras backend of the Keras run: tensorflow, torch or jax (default $KERAS_BACKEND, else tensorflow)")


def run(args: argparse.Namespace) -> int:
    names = sorted(FRAMEWORKS) if args.framework == "both" else [args.framework]
    status = 0
    for name in names:
        env = dict(os.environ, KERAS_BACKEND=args.keras_backend)
        cmd = [sys.executable, *FRAMEWORKS[name], "--dirpath", os.path.join(args.dirpath, name), "--budget", args.budget]
        own = {"lightning": ("--steps", args.steps), "keras": ("--epochs", args.epochs)}[name]
        if own[1] is not None:
            cmd += [own[0], str(own[1])]
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        code = _wait_through_ctrl_c(cmd, env)
        if code == 128 + signal.SIGINT:
            return code
        status = code or status
    return status


def _wait_through_ctrl_c(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd`` and wait for it; a SIGINT meanwhile is the child's to act on (its emergency
    checkpoint), so here it does nothing. A Python handler, not ``SIG_IGN``: the child starts
    with the default disposition (an ignored signal would stay ignored across ``exec``)."""
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        return subprocess.call(cmd, env=env)
    finally:
        signal.signal(signal.SIGINT, previous)
