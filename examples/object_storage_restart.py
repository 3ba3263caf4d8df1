"""Restart from object storage in Lightning: a new process to its first trained step, with
``dirpath="s3://..."``, autockpt against Lightning's own ``ModelCheckpoint`` + ``ckpt_path``.

The bucket is a real S3-compatible server (``moto.server``, started as its own process on
127.0.0.1, as the tests do; run this from a checkout with ``autockpt[s3]`` and ``moto[server]``
installed). Per size and round, for each method: one process trains 4 steps of a stack of
1024×1024 linear layers (plain SGD: the checkpoint is about the weights' size) and checkpoints
at step 4 to the bucket; a new process then resumes from it and trains one step. The resumed
process reports the seconds from its start to the line before ``fit()`` (imports, model),
from there to the end of its first trained step (finding, downloading, verifying and loading
the checkpoint; one step), and the bytes it read from the bucket.

- autockpt: ``AutoCheckpoint(url, storage_options=..., every_n_steps=4)``; the rerun finds the
  newest checkpoint itself.
- native: ``ModelCheckpoint(dirpath=url, every_n_train_steps=4)`` and ``fit(ckpt_path=...)``,
  the bucket's endpoint and keys given to fsspec through ``FSSPEC_S3`` (Lightning takes no
  storage options); it does not verify the file.

``--source DIR``: the checkout whose ``autockpt_*`` packages the processes import (default:
this one), to compare two versions on one machine.

    python examples/object_storage_restart.py --sizes 64 256 --rounds 3 --json restart.json
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parents[1]
METHODS = ("autockpt", "native")
STEPS = 4


def child(args: argparse.Namespace) -> None:
    """One training process (``--child train``) or one resumed process (``--child resume``)."""
    started = float(args.started)
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    read = {"bytes": 0}
    import fsspec.spec

    original_read = fsspec.spec.AbstractBufferedFile.read

    def counted(self: Any, *a: Any) -> bytes:
        data = original_read(self, *a)
        if "r" in self.mode:
            read["bytes"] += len(data)
        return data

    fsspec.spec.AbstractBufferedFile.read = counted  # type: ignore[method-assign]

    class Stack(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(max(1, args.mb // 4))])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    class FirstStep(pl.Callback):
        def __init__(self) -> None:
            self.at: float | None = None

        def on_train_batch_end(self, trainer: pl.Trainer, *rest: Any) -> None:
            if self.at is None:
                self.at = time.time()

    options = json.loads(args.options)
    if args.method == "autockpt":
        from autockpt_lightning import AutoCheckpoint

        callbacks: list[Any] = [AutoCheckpoint(args.url, storage_options=options, every_n_steps=STEPS, verbose=False)]
        checkpointing, ckpt_path = False, None
    else:
        from lightning.pytorch.callbacks import ModelCheckpoint

        callbacks = [ModelCheckpoint(dirpath=args.url, filename="{step}", every_n_train_steps=STEPS, save_top_k=-1)]
        checkpointing = True
        ckpt_path = f"{args.url}/step={STEPS}.ckpt" if args.child == "resume" else None
    first = FirstStep()
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 1024)), batch_size=8)
    trainer = pl.Trainer(
        max_steps=STEPS + (1 if args.child == "resume" else 0), callbacks=[*callbacks, first], logger=False,
        enable_checkpointing=checkpointing, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, accelerator="cpu", devices=1,
    )  # fmt: skip
    model = Stack()
    before_fit = time.time()
    trainer.fit(model, data, ckpt_path=ckpt_path)
    if args.child == "resume":
        assert first.at is not None and trainer.global_step == STEPS + 1, trainer.global_step
        print("RESULT " + json.dumps({"to_fit_s": before_fit - started, "fit_to_first_step_s": first.at - before_fit,
                                      "restart_s": first.at - started, "read_bytes": read["bytes"]}), flush=True)  # fmt: skip
    os._exit(0)  # no teardown: as a job that is killed after its checkpoint


def run_child(role: str, method: str, url: str, mb: int, server: Any, source: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(source), str(HERE)]))
    env["FSSPEC_S3"] = json.dumps(server.storage_options)  # the native method's only way to reach the server
    command = [sys.executable, __file__, "--child", role, "--method", method, "--url", url, "--mb", str(mb),
               "--options", json.dumps(server.storage_options), "--started", repr(time.time())]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, cwd=source)
    if proc.returncode != 0:
        raise RuntimeError(f"{role} {method} {mb} MiB failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT ") :]) if lines else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256], help="weights in MiB (multiples of 4)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--source", default=str(HERE), help="checkout whose autockpt the processes import")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--child", choices=("train", "resume"), help=argparse.SUPPRESS)
    for hidden in ("--method", "--url", "--mb", "--options", "--started"):
        parser.add_argument(hidden, help=argparse.SUPPRESS, type=int if hidden == "--mb" else str)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(HERE))  # tests.s3_server, from a checkout
    from tests.s3_server import S3Server

    source = Path(args.source).resolve()
    server = S3Server().start()
    rows: list[dict[str, Any]] = []
    try:
        for mb in args.sizes:
            for r in range(args.rounds):
                for method in METHODS if r % 2 == 0 else METHODS[::-1]:
                    url = server.url(f"restart-{method}-{mb}-{uuid.uuid4().hex[:8]}")
                    run_child("train", method, url, mb, server, source)
                    result = run_child("resume", method, url, mb, server, source)
                    rows.append({"size_mib": mb, "method": method, "round": r, **result})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop()
    print("| size | method | restart s (new process → first step) | to fit() s | fit() → first step s | read from the bucket |")
    print("|---|---|---|---|---|---|")
    for mb in args.sizes:
        for method in METHODS:
            mine = [row for row in rows if row["size_mib"] == mb and row["method"] == method]

            def med(key: str) -> str:
                values = [row[key] for row in mine]
                return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"

            read = statistics.median(row["read_bytes"] for row in mine) / 2**20
            print(f"| {mb} MiB | {method} | {med('restart_s')} | {med('to_fit_s')} | {med('fit_to_first_step_s')} "
                  f"| {read:.0f} MiB |")  # fmt: skip
    if args.json:
        machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}
        Path(args.json).write_text(json.dumps({"machine": machine, "source": str(source), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
