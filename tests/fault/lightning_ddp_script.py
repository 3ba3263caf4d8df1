"""DDP training script for the Lightning fault tests: 2 CPU ranks (gloo), one process each.

``python -m tests.fault.lightning_ddp_script ROOT STEPS FAULT``

Rank 0 is this process; Lightning starts rank 1 as a child process running the same command.
``FAULT`` is one of:

- ``none``;
- ``sigterm-rank1@N``: rank 1 sends itself SIGTERM inside training step N (rank 0 gets no signal);
- ``persist-error``: rank 0's checkpoint writes fail (ENOSPC) from the second checkpoint on;
- ``snapshot-oom``: rank 0's second snapshot raises ``MemoryError`` (the other rank is in the
  same checkpoint's collectives);
- ``bad-manifest``: an unreadable manifest in the checkpoint directory (only rank 0 reads it);
- ``slow-rank1-save``: rank 1 takes 0.3 s longer inside every checkpoint (in
  ``on_save_checkpoint``), so every rank waits for it at the checkpoint's last collective;
- ``sharded-rank1-write-error``: the model is sharded (``ModelParallelStrategy``, FSDP2) and
  rank 1's own shards fail to be written (ENOSPC) from the second checkpoint on, in DCP's
  background thread; rank 0's writes succeed;
- ``sharded-snapshot-oom``: the model is sharded, and rank 0's second ``dump_checkpoint``
  raises ``MemoryError`` (rank 1's succeeds: no rank may start its save alone).

Each rank writes one line ``RESULT rank=R code=C stopped=S saved=[...] error=...`` as it ends
(C: the exit status it ends with; S: the step it stopped at after a signal; saved: rank 0's
checkpoints; stall: rank 0's profiler estimate of the checkpoint stall; copies: rank 0's own
blocked time in each checkpoint's copy) to ``ROOT/result-rank<R>.txt`` and exits with that status.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from typing import Any

import torch

torch.set_num_threads(1)

from lightning.pytorch.strategies import ModelParallelStrategy  # noqa: E402

from autockpt_lightning import AutoCheckpoint  # noqa: E402
from tests.fault.child import exit_without_teardown  # noqa: E402
from tests.faults import FailingStorage  # noqa: E402
from tests.lightning.lightning_helpers import ShardedTinyModel, TinyData, TinyModel, make_trainer  # noqa: E402


class SignalOnRank1(TinyModel):
    AT = -1

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_rank == 1 and self.trainer.global_step == self.AT:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(batch, batch_idx)


class SlowSaveOnRank1(TinyModel):
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.trainer.global_rank == 1:
            time.sleep(0.3)


def fail_rank1_shard_writes_after_the_first() -> None:
    from torch.distributed.checkpoint import FileSystemWriter

    original = FileSystemWriter.write_data
    calls = 0

    def write_data(self: Any, plan: Any, planner: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls >= 2 and int(os.environ.get("LOCAL_RANK", "0")) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, plan, planner)

    FileSystemWriter.write_data = write_data  # type: ignore[method-assign]


class ArmAfterFirstCheckpoint(FailingStorage):
    def write_atomic(self, name: str, write: Any) -> Any:
        result = super().write_atomic(name, write)
        if name.endswith(".ckpt"):
            self.armed = True
        return result


def main() -> int:
    root, steps, fault = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    model: TinyModel = TinyModel()
    storage = None
    strategy: Any = "ddp"
    if fault.startswith("sigterm-rank1@"):
        SignalOnRank1.AT = int(fault.split("@")[1])
        model = SignalOnRank1()
    elif fault == "slow-rank1-save":
        model = SlowSaveOnRank1()
    elif fault == "snapshot-oom":
        import autockpt_lightning.callback as callback_module

        class OutOfMemoryAtSecond(callback_module.TorchSnapshotter):  # type: ignore[misc,name-defined]
            calls = 0

            def snapshot(self, *args: Any, **kwargs: Any) -> Any:
                type(self).calls += 1
                if type(self).calls == 2:
                    raise MemoryError("cannot allocate the snapshot buffers (simulated)")
                return super().snapshot(*args, **kwargs)

        callback_module.TorchSnapshotter = OutOfMemoryAtSecond  # type: ignore[attr-defined,misc]
    elif fault == "bad-manifest":
        os.makedirs(root + "/ck", exist_ok=True)
        with open(root + "/ck/autockpt-manifest.json", "w") as f:
            f.write("{not json")
    elif fault == "sharded-rank1-write-error":
        model = ShardedTinyModel()
        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
        fail_rank1_shard_writes_after_the_first()
    elif fault == "sharded-snapshot-oom":
        model = ShardedTinyModel()
        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
        import autockpt_lightning.sharded as sharded_module

        split, calls = sharded_module.split_checkpoint, []

        def split_or_fail(checkpoint: dict[str, Any]) -> Any:
            calls.append(1)
            if len(calls) == 2 and int(os.environ.get("LOCAL_RANK", "0")) == 0:
                raise MemoryError("cannot allocate the snapshot (simulated)")
            return split(checkpoint)

        sharded_module.split_checkpoint = split_or_fail  # type: ignore[assignment]
    elif fault == "persist-error":
        storage = ArmAfterFirstCheckpoint(root + "/ck", error=OSError(errno.ENOSPC, "No space left on device"))
    cb = AutoCheckpoint(root + "/ck", every_n_steps=5, verbose=True, storage=storage)
    trainer = make_trainer(root, [cb], steps, strategy=strategy, devices=2, enable_checkpointing=False)
    code, error = 0, ""
    try:
        trainer.fit(model, TinyData())
    except SystemExit as exc:
        code = int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        code, error = 1, f"{type(exc).__name__}: {exc}"
    stopped = cb.preempted.step if cb.preempted is not None else None
    saved = [e.step for e in cb.events]
    stall = cb.session.estimates().stall_s if cb.session is not None else None
    copies = [round(e.stall_s, 4) for e in cb.events]
    line = (
        f"RESULT rank={trainer.global_rank} code={code} stopped={stopped} saved={saved} "
        f"stall={stall} copies={copies} error={error}"
    )
    with open(os.path.join(root, f"result-rank{trainer.global_rank}.txt"), "w") as f:
        f.write(line)  # not on stdout, where the ranks' lines interleave
    return code


if __name__ == "__main__":
    exit_without_teardown(main())
