"""Lightning training script for the fault harness (contract: see harness.py).

``python -m tests.fault.lightning_script DIRPATH OUT [--baseline] [--loader stateful|sampler|sampler-workers|iterable]
[--epochs N] [--every K] [--val] [--async-persist 0|1] [--persist-mode thread|process] [--devices N] [--sharded]
[--val-batch B] [--val-every N] [--val-sleep S] [--grace D] ...``

A small MLP with dropout, Adam and a per-step StepLR, on shuffled synthetic data: 96 samples,
batch 8, so 12 steps per epoch; a shuffled validation loader runs after each epoch (with
``--val``; 32 samples in batches of ``--val-batch``, every ``--val-every`` steps if given, each
batch sleeping ``--val-sleep`` seconds). The callback checkpoints every ``--every`` steps (dense, so faults land in every
phase), keeps 2, and resumes automatically. Faults come from ``tests.fault.child``. With
``--persist-mode process`` the checkpoint files are written by autockpt's persist process
(the script waits for it to be ready before training, so every checkpoint is) and the
persist phase is reported there (``tests.fault.child.write_records_with_faults``).

``--devices 2`` trains with DDP on 2 CPU processes (gloo): Lightning starts rank 1 running the
same command; each rank draws its own dropout masks and reads its own shard of every epoch
(torchdata's ``StatefulDistributedSampler`` inside the ``StatefulDataLoader``); only rank 0 writes
``OUT``. The harness runs the script in its own process group, so a kill takes every rank.
With ``--sharded`` the ranks train under ``ModelParallelStrategy``, FSDP2 sharding every
layer over them (``Net.configure_model``), and every rank writes its shards of each checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch

torch.set_num_threads(1)

import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.strategies import ModelParallelStrategy  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, TensorDataset  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler  # noqa: E402

from autockpt_lightning import AutoCheckpoint, ResumableSampler  # noqa: E402
import autockpt_lightning.callback as callback_module  # noqa: E402
from tests.fault.child import HALF, PROCESS_WRITE, FaultPlan, FaultStorage, exit_without_teardown  # noqa: E402

PLAN = FaultPlan.from_env()


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        PLAN.hit("step", step=self.trainer.global_step)
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        PLAN.hit("sanity" if self.trainer.sanity_checking else "val", step=self.trainer.global_step)
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        PLAN.hit("snapshot", step=self.trainer.global_step)  # inside dump_checkpoint: phase 1

    def configure_model(self) -> None:
        """Under ModelParallelStrategy (``--sharded``): FSDP2 shards every layer's parameters
        over the data-parallel ranks (each rank holds half of each weight)."""
        if isinstance(self.trainer.strategy, ModelParallelStrategy):
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in self.net:
                if any(True for _ in layer.parameters()):
                    fully_shard(layer, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Stream(IterableDataset):
    """An unsized, stateful stream over the samples (in a per-pass shuffled order)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.pos, self.rounds = 0, 0

    def __iter__(self) -> Any:
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(self.rounds))
        while self.pos < len(order):
            i = int(order[self.pos])
            self.pos += 1
            yield self.x[i], self.y[i]
        self.pos, self.rounds = 0, self.rounds + 1

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos, "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos, self.rounds = state["pos"], state["rounds"]


class Data(pl.LightningDataModule):
    def __init__(self, loader: str, val: bool, val_batch: int = 16) -> None:
        super().__init__()
        self.val_batch = val_batch
        gen = torch.Generator().manual_seed(1234)
        self.x = torch.randn(96, 8, generator=gen)
        self.y = self.x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(96, 1, generator=gen)
        self.loader, self.val = loader, val

    def train_dataloader(self) -> Any:
        data = TensorDataset(self.x, self.y)
        if self.loader == "stateful":
            if self.trainer is not None and self.trainer.world_size > 1:
                # Every rank's shard in a seeded order whose position is saved (see loader_problems)
                return StatefulDataLoader(data, batch_size=8, sampler=StatefulDistributedSampler(data, seed=7))
            return StatefulDataLoader(data, batch_size=8, shuffle=True)
        if self.loader in ("sampler", "sampler-workers"):
            workers = 2 if self.loader == "sampler-workers" else 0  # workers pull indices ahead of training
            sampler = ResumableSampler(data, shuffle=True, seed=7)
            return DataLoader(data, batch_size=8, sampler=sampler, num_workers=workers)
        if self.loader == "iterable":
            return StatefulDataLoader(Stream(self.x, self.y), batch_size=8)
        raise ValueError(self.loader)

    def val_dataloader(self) -> Any:
        return DataLoader(TensorDataset(self.x[:32], self.y[:32]), batch_size=self.val_batch, shuffle=True)


def train(
    dirpath: str,
    *,
    baseline: bool = False,
    loader: str = "stateful",
    epochs: int = 3,
    every: int = 2,
    val: bool = False,
    async_persist: bool = True,
    root: str | None = None,
    extra_callbacks: tuple[pl.Callback, ...] = (),
    model_cls: type[Net] = Net,
    ckpt_path: str | None = None,
    sanity: int = 0,
    persist_mode: str = "thread",
    devices: int = 1,
    sharded: bool = False,
    val_batch: int = 16,
    val_every: int | None = None,
    **callback_kwargs: Any,
) -> tuple[Net, pl.Trainer, AutoCheckpoint | None]:
    """Seed, build and fit; returns the model, the trainer and the callback (None for baseline)."""
    pl.seed_everything(0, verbose=False)
    model = model_cls()
    callback = None
    in_process = persist_mode == "process"
    if in_process:
        callback_module.WRITE_RECORDS = PROCESS_WRITE  # type: ignore[misc]  # the persist process's writer, by name
        extra_callbacks = (*extra_callbacks, WaitForPersistProcess())
    if not baseline:
        callback_kwargs.setdefault(
            "storage", FaultStorage(dirpath, PLAN, suffix=".ckpt", half=HALF, process_writable=in_process)
        )
        callback_kwargs.setdefault("persist_mode", persist_mode)
        callback_kwargs.setdefault("keep_last", 2)
        callback = AutoCheckpoint(dirpath, every_n_steps=every, async_persist=async_persist, **callback_kwargs)
    if sharded:
        report_sharded_persist()
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=devices,
        strategy=_strategy(devices, sharded),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=sanity,
        limit_val_batches=32 // val_batch if val else 0,
        val_check_interval=val_every,
        default_root_dir=root or dirpath,
        callbacks=[*([callback] if callback else []), *extra_callbacks],
    )
    trainer.fit(model, Data(loader, val, val_batch), ckpt_path=ckpt_path)
    return model, trainer, callback


def report_sharded_persist() -> None:
    """A sharded checkpoint is committed as a directory (``commit_file_set``), not through the
    storage's ``write_atomic``: report the persist phase on rank 0's writer thread once every
    rank's shards are written, before ``meta.pt`` is added and the directory renamed."""
    import autockpt_core.persist.writer as writer_module
    from autockpt_core.persist.file_set import FileSetWrite, commit_file_set

    def commit_with_fault(storage: Any, file_set: FileSetWrite, name: str) -> Any:
        def fill(path: Any) -> Any:
            known = file_set.fill(path)
            PLAN.hit("persist", name=name)
            return known

        return commit_file_set(storage, FileSetWrite(file_set.path, fill), name)

    writer_module.commit_file_set = commit_with_fault  # type: ignore[assignment]


def _strategy(devices: int, sharded: bool) -> Any:
    if sharded:  # FSDP2 over every rank (configure_model), checkpointed sharded
        return ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1)
    return "ddp" if devices > 1 else "auto"


class SleepEachStep(pl.Callback):
    """A longer run: each training step sleeps (the weights do not change)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(self.seconds)


class SleepEachValidationBatch(pl.Callback):
    """A longer validation: each validation batch sleeps (the sanity check's too)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_validation_batch_end(self, *args: Any) -> None:
        time.sleep(self.seconds)


class WaitForPersistProcess(pl.Callback):
    """Every checkpoint is then written by the persist process (until it is ready, the writer
    thread writes them)."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        auto = next((c for c in trainer.callbacks if isinstance(c, AutoCheckpoint)), None)  # type: ignore[attr-defined]
        if auto is not None and auto.session is not None:
            assert auto.session.persist_mode.mode == "process", auto.session.persist_mode
            assert auto.session.wait_for_persist_process(60), "the persist process did not start"


def weights_of(model: pl.LightningModule) -> dict[str, np.ndarray]:
    """The model's weights as arrays; a sharded model's are gathered whole (a collective:
    every rank calls it, rank 0 gets them)."""
    state = model.state_dict()
    if any(hasattr(v, "full_tensor") for v in state.values()):
        state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}
    return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dirpath")
    parser.add_argument("out")
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--loader", default="stateful", choices=["stateful", "sampler", "sampler-workers", "iterable"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--val", action="store_true")
    parser.add_argument("--async-persist", type=int, default=1)
    parser.add_argument("--sanity", type=int, default=0, help="validation batches of the sanity check")
    parser.add_argument("--persist-mode", default="thread", choices=["thread", "process"])
    parser.add_argument("--devices", type=int, default=1, help="2 or more: DDP on CPU processes (gloo)")
    parser.add_argument("--sharded", action="store_true", help="ModelParallelStrategy with FSDP2 over --devices ranks")
    parser.add_argument("--mirror", default=None, help="the callback's mirror (a URL or directory)")
    parser.add_argument("--storage-options", default=None, help="the callback's storage_options, as JSON")
    parser.add_argument("--deadline", default=None, help="the callback's deadline")
    parser.add_argument("--notice", default=None, help="the callback's preemption_notice (polled every 0.2 s)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds each training step sleeps (a long run)")
    parser.add_argument("--val-sleep", type=float, default=0.0, help="seconds each validation batch sleeps")
    parser.add_argument("--val-batch", type=int, default=16, help="the validation loader's batch size (32 samples)")
    parser.add_argument("--val-every", type=int, default=None, help="validation every N steps (12 per epoch)")
    parser.add_argument("--grace", default=None, help="the callback's grace_period")
    args = parser.parse_args(argv)
    mirrored: dict[str, Any] = {} if args.baseline or not args.mirror else {"mirror": args.mirror}
    if args.deadline and not args.baseline:
        mirrored["deadline"] = args.deadline
    if args.notice and not args.baseline:
        mirrored.update(preemption_notice=args.notice, notice_poll_interval=0.2)
    if args.grace and not args.baseline:
        mirrored["grace_period"] = args.grace
    sleeps = (SleepEachStep(args.step_sleep),) if args.step_sleep else ()
    sleeps += (SleepEachValidationBatch(args.val_sleep),) if args.val_sleep else ()
    if sleeps:
        mirrored["extra_callbacks"] = sleeps
    if mirrored and args.storage_options:
        mirrored["storage_options"] = json.loads(args.storage_options)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    model, trainer, _ = train(
        args.dirpath,
        baseline=args.baseline,
        loader=args.loader,
        epochs=args.epochs,
        every=args.every,
        val=args.val,
        async_persist=bool(args.async_persist),
        sanity=args.sanity,
        persist_mode=args.persist_mode,
        devices=args.devices,
        sharded=args.sharded,
        val_batch=args.val_batch,
        val_every=args.val_every,
        root=os.path.dirname(os.path.abspath(args.out)),
        **mirrored,
    )
    weights = weights_of(model)
    if torch.distributed.is_initialized():
        # torch asks for this before exit; Lightning does not do it. It did not stop the rare
        # abort at interpreter exit that exit_without_teardown avoids.
        torch.distributed.destroy_process_group()
    if trainer.global_rank == 0:
        tmp = args.out + ".tmp.npz"
        np.savez(tmp, **weights)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    multi_process = "--devices" in sys.argv and sys.argv[sys.argv.index("--devices") + 1] != "1"
    try:
        status = main()
    except SystemExit as stop:  # Preempted: 143 after the emergency checkpoint
        if not multi_process:
            raise
        status = stop.code if isinstance(stop.code, int) else 1
    if multi_process:
        exit_without_teardown(status)
    sys.exit(status)
