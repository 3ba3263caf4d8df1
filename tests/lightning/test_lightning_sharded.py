"""AutoCheckpoint with a sharded model: ``ModelParallelStrategy`` with FSDP2 on two CPU
processes (gloo). Every rank writes its own shards; the checkpoint is a directory Lightning's
own loader takes, listed (every file with its checksum) in the manifest."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autockpt_core import ConfigError, read_manifest, storage_for
from autockpt_core.config import Config
from autockpt_lightning.sharded import check_sharded_config

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    sys.path.insert(0, {root!r})
    from lightning.pytorch.strategies import ModelParallelStrategy
    from tests.lightning.lightning_helpers import ShardedTinyModel, TinyData, make_trainer
    from autockpt_lightning import AutoCheckpoint, latest_checkpoint

    torch.set_num_threads(1)
    root, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    callbacks = [AutoCheckpoint(root + "/ck", every_n_steps=4, verbose=True)] if mode == "auto" else []

    class Start(__import__("lightning").pytorch.Callback):
        def on_train_start(self, trainer, pl_module):
            self.step = trainer.global_step

    start = Start()
    trainer = make_trainer(root, [*callbacks, start], steps, strategy=strategy, devices=2, enable_checkpointing=False)
    ckpt_path = latest_checkpoint(root + "/ck") if mode == "lightning" else None
    trainer.fit(ShardedTinyModel(), TinyData(stateful=True), ckpt_path=ckpt_path)
    saved = [e.step for e in callbacks[0].events] if callbacks else []
    print(f"RESULT rank={{trainer.global_rank}} start={{start.step}} saved={{saved}}", flush=True)
    torch.distributed.destroy_process_group()  # torch asks for it before exit
    from tests.fault.child import exit_without_teardown
    exit_without_teardown(0)  # not torch's teardown at exit, which rarely aborts (see there)
    """
)


@pytest.mark.integration
def test_every_rank_writes_its_shards_and_lightning_loads_the_directory(tmp_path: Path) -> None:
    script = tmp_path / "train_sharded.py"
    script.write_text(SCRIPT.format(root=str(REPO)))
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")

    output = ""

    def run(steps: int, mode: str) -> set[str]:
        nonlocal output
        proc = subprocess.run(
            [sys.executable, str(script), str(tmp_path), str(steps), mode],
            capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        output = proc.stdout + proc.stderr
        return set(re.findall(r"RESULT rank=\d+ start=\d+ saved=\[[^\]]*\]", proc.stdout))

    assert run(10, "auto") == {"RESULT rank=0 start=0 saved=[4, 8, 10]", "RESULT rank=1 start=0 saved=[]"}
    # auto-resume from the final checkpoint of the first run (step 10 is mid-epoch: 64 batches per epoch)
    assert run(14, "auto") == {"RESULT rank=0 start=10 saved=[12, 14]", "RESULT rank=1 start=10 saved=[]"}
    records = read_manifest(storage_for(tmp_path / "ck"))
    assert [r.step for r in records] == [10, 12, 14]  # keep_last=3 (the default)
    newest = records[-1]
    assert (tmp_path / "ck" / newest.name).is_dir()
    assert sorted(newest.files or {}) == [
        ".autockpt-files-rank0.json",  # each rank's checksums of its own files
        ".autockpt-files-rank1.json",
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "meta.pt",
    ]
    # Lightning's own loader (ModelParallelStrategy.load_checkpoint) takes the directory
    assert run(16, "lightning") == {"RESULT rank=0 start=14 saved=[]", "RESULT rank=1 start=14 saved=[]"}
    # autockpt inspect verifies every file of every record
    inspect = subprocess.run(
        [sys.executable, "-m", "autockpt_core.cli", "inspect", str(tmp_path / "ck"), "--json"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert inspect.returncode == 0, inspect.stderr
    assert [(c["step"], c["status"]) for c in json.loads(inspect.stdout)] == [(10, "ok"), (12, "ok"), (14, "ok")]
    # A resume verifies each rank's shards on that rank: rank 1's torn shard makes both ranks resume step 12
    (tmp_path / "ck" / newest.name / "__1_0.distcp").write_bytes(b"torn")
    assert run(18, "auto") == {"RESULT rank=0 start=12 saved=[16, 18]", "RESULT rank=1 start=12 saved=[]"}
    assert re.search(rf"skipping checkpoint {re.escape(newest.name)} \(step 14\).*__1_0\.distcp.*checked by rank 1", output)


@pytest.mark.parametrize(
    "config, field",
    [
        (Config(dirpath="memory://bucket/ck"), "dirpath=.memory://bucket/ck.: sharded checkpoints"),
        (Config(dirpath="ck", mirror="memory://bucket/ck"), "mirror=.memory://bucket/ck.: autockpt does not copy"),
    ],
)
def test_sharded_checkpoints_refuse_object_storage_and_a_mirror_at_setup(config: Config, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        check_sharded_config(config, None)
    check_sharded_config(Config(dirpath="ck"), None)
    check_sharded_config(Config(dirpath="file:///tmp/ck"), None)
    check_sharded_config(Config(dirpath="local:///tmp/ck"), None)  # local everywhere, as for storage_for
