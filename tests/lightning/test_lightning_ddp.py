"""AutoCheckpoint under DDP: two CPU processes (gloo); rank 0 writes, both ranks resume."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    sys.path.insert(0, {root!r})
    from tests.lightning.lightning_helpers import Recorder, TinyData, TinyModel, make_trainer
    from autockpt_lightning import AutoCheckpoint

    torch.set_num_threads(1)
    root, steps = sys.argv[1], int(sys.argv[2])
    cb = AutoCheckpoint(root + "/ck", every_n_steps=5, verbose=False)
    recorder = Recorder(cb)
    trainer = make_trainer(root, [cb, recorder], steps, strategy="ddp", devices=2, enable_checkpointing=False)
    trainer.fit(TinyModel(), TinyData())
    print(f"RESULT rank={{trainer.global_rank}} start={{recorder.start_step}} "
          f"saved={{[e.step for e in cb.events]}}", flush=True)
    from tests.fault.child import exit_without_teardown
    exit_without_teardown(0)  # not torch's teardown at exit, which rarely aborts (see there)
    """
)


@pytest.mark.integration
@pytest.mark.slow
def test_ddp_two_processes_rank_zero_writes_and_both_resume(tmp_path: Path) -> None:
    script = tmp_path / "train_ddp.py"
    script.write_text(SCRIPT.format(root=str(Path(__file__).resolve().parents[2])))
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def run(steps: int) -> set[str]:
        proc = subprocess.run(
            [sys.executable, str(script), str(tmp_path), str(steps)],
            capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # Both ranks print to one pipe: their lines may interleave, so match the records, not lines.
        return set(re.findall(r"RESULT rank=\d+ start=\d+ saved=\[[^\]]*\]", proc.stdout))

    # 12 and 22: the final checkpoints; the rerun resumes from 12 (mid-epoch: exact).
    assert run(12) == {"RESULT rank=0 start=0 saved=[5, 10, 12]", "RESULT rank=1 start=0 saved=[]"}
    assert run(22) == {"RESULT rank=0 start=12 saved=[15, 20, 22]", "RESULT rank=1 start=12 saved=[]"}
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names == [
        "autockpt-manifest.json",
        "autockpt-status.json",
        "ckpt-step000000015.ckpt",
        "ckpt-step000000020.ckpt",
        "ckpt-step000000022.ckpt",
    ]
    import torch

    state = torch.load(tmp_path / "ck" / "ckpt-step000000022.ckpt", weights_only=False)["callbacks"]["AutoCheckpoint"]
    assert sorted(state["rng"]) == [0, 1] and state["world_size"] == 2  # every rank's generators


def test_unsupported_strategies_are_refused_naming_the_fix() -> None:
    """Strategies the callback cannot serve fail in ``setup()`` with an error that names them
    and the fix; single-device, DDP and ModelParallelStrategy (sharded) pass."""
    from types import SimpleNamespace

    from lightning.pytorch.strategies import (
        DDPStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        SingleDeviceStrategy,
    )

    from autockpt_core import AutockptError
    from autockpt_lightning.distributed import check_strategy

    refused = [
        (FSDPStrategy(), r"does not support FSDPStrategy \(FSDP1\)\. Fix: shard the model with FSDP2's fully_shard"),
        (
            ModelParallelStrategy(save_distributed_checkpoint=False),
            r"save_distributed_checkpoint=False.*Fix: ModelParallelStrategy\(save_distributed_checkpoint=True\)",
        ),
    ]
    class OtherStrategy:  # DeepSpeed and the like (deepspeed is not installed here)
        pass

    refused.append((OtherStrategy(), r"not OtherStrategy\. Fix: use strategy='ddp'"))
    for strategy, message in refused:
        with pytest.raises(AutockptError, match=message):
            check_strategy(SimpleNamespace(strategy=strategy))  # type: ignore[arg-type]
    for strategy in (DDPStrategy(), SingleDeviceStrategy("cpu"), ModelParallelStrategy()):
        check_strategy(SimpleNamespace(strategy=strategy))  # type: ignore[arg-type]
