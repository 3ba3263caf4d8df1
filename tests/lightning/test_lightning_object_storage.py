"""Lightning with ``dirpath="s3://..."`` and ``storage_options``, against a real S3-compatible
server (moto, a process on 127.0.0.1): a run that crashes mid-epoch is rerun and resumes from
the newest object (fetched with the options, since Lightning would open the URL without
them), ending bitwise equal to an uninterrupted run; under DDP the ranks of a node share one
download."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from autockpt_core import read_manifest, storage_for
from autockpt_core.persist.storage import FsspecStorage
from autockpt_lightning import auto_resume, latest_checkpoint
from tests.fault.harness import assert_weights_equal
from tests.fault.lightning_script import train, weights_of
from tests.lightning.test_lightning_exact_resume import baseline, crash_at

torch.set_num_threads(1)
pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::UserWarning")]


def crashed_run(tmp_path: Path, s3_server: Any, prefix: str) -> tuple[str, dict[str, Any], Any]:
    """A run checkpointing to a new prefix of the bucket every 3 steps, crashed at step 17;
    its URL, the arguments that rerun it, and its storage."""
    url = s3_server.url(f"{prefix}-{uuid.uuid4().hex[:8]}")
    options = s3_server.storage_options
    common: dict[str, Any] = dict(val=True, epochs=2, every=3, storage=None, storage_options=options, root=str(tmp_path))
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(url, model_cls=crash_at(17), **common)
    return url, common, storage_for(url, options)


def test_lightning_checkpoints_to_s3_and_a_rerun_resumes_bitwise(tmp_path: Path, s3_server: Any) -> None:
    url, common, storage = crashed_run(tmp_path, s3_server, "lightning")
    options = s3_server.storage_options
    assert [r.step for r in read_manifest(storage)][-1] == 15
    assert latest_checkpoint(url, storage_options=options) == f"{url}/ckpt-step000000015.ckpt"

    model, _, cb = train(url, **common)
    assert cb is not None and cb.resumed_from == 15
    assert isinstance(cb.session.storage, FsspecStorage)  # type: ignore[union-attr]
    assert_weights_equal(weights_of(model), baseline(tmp_path))
    assert len(read_manifest(storage)) == 2  # keep_last=2, retention on the server too


@pytest.mark.parametrize("loads_while_picking", [True, False], ids=["strategy-load", "own-load"])
def test_a_resume_from_s3_downloads_the_checkpoint_once(
    tmp_path: Path, s3_server: Any, monkeypatch: pytest.MonkeyPatch, loads_while_picking: bool
) -> None:
    """The newest object is read once, verified on the way, and Lightning loads that copy; a
    corrupt newer object is passed over and leaves no copy behind. Also where rank 0 cannot
    load while it picks (a strategy with a load of its own, as FSDP's): it only fetches then."""
    url, common, storage = crashed_run(tmp_path, s3_server, "lightning-once")
    older, newest = read_manifest(storage)[-2:]
    assert newest.step == 15 and older.step < 15
    with storage.open_read(newest.name) as f:
        payload = bytearray(f.read())
    payload[len(payload) // 2] ^= 0xFF  # same size: only the checksum finds it
    storage.write_atomic(newest.name, lambda f: f.write(bytes(payload)))

    read: dict[str, int] = {}
    opened = FsspecStorage.open_read

    def counting_open_read(self: FsspecStorage, name: str) -> Any:
        raw = opened(self, name)
        original_read = raw.read

        def counted(*args: Any) -> bytes:
            data = original_read(*args)
            read[name] = read.get(name, 0) + len(data)
            return data

        raw.read = counted
        return raw

    monkeypatch.setattr(FsspecStorage, "open_read", counting_open_read)
    monkeypatch.setattr(auto_resume, "download", lambda *a, **k: pytest.fail("downloaded a second time"))
    if not loads_while_picking:
        monkeypatch.setattr(auto_resume, "fusable", lambda trainer, sharded: False)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.warns(RuntimeWarning, match=f"skipping checkpoint {newest.name}"):
        model, _, cb = train(url, **common)
    assert cb is not None and cb.resumed_from == older.step
    assert read[newest.name] == newest.size and read[older.name] == older.size  # each object read once
    assert not list(scratch.glob("autockpt-fetched-*"))  # the copies are gone


DDP_SCRIPT = """
import logging, sys
import torch
sys.path.insert(0, {root!r})
from tests.lightning.lightning_helpers import Recorder, TinyData, TinyModel, make_trainer
from autockpt_lightning import AutoCheckpoint

torch.set_num_threads(1)
logging.basicConfig(level=logging.INFO, format="%(message)s")
root, url, endpoint, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
options = {{"endpoint_url": endpoint, "key": "testing", "secret": "testing"}}
cb = AutoCheckpoint(url, storage_options=options, every_n_steps=3, verbose=False)
recorder = Recorder(cb)
trainer = make_trainer(root, [cb, recorder], steps, strategy="ddp", devices=2, enable_checkpointing=False)
trainer.fit(TinyModel(), TinyData())
print(f"RESULT rank={{trainer.global_rank}} start={{recorder.start_step}}", flush=True)
from tests.fault.child import exit_without_teardown
exit_without_teardown(0)
"""


def test_ddp_ranks_of_one_node_resume_from_s3_through_one_download(tmp_path: Path, s3_server: Any) -> None:
    url = s3_server.url(f"lightning-ddp-{uuid.uuid4().hex[:8]}")
    script = tmp_path / "train_ddp_s3.py"
    script.write_text(DDP_SCRIPT.format(root=str(Path(__file__).resolve().parents[2])))
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))

    def run(steps: int) -> tuple[set[str], str]:
        proc = subprocess.run(
            [sys.executable, str(script), str(tmp_path), url, s3_server.endpoint, str(steps)],
            capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
        )  # fmt: skip
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-4000:]
        return set(re.findall(r"RESULT rank=\d+ start=\d+", proc.stdout)), output

    assert run(7)[0] == {"RESULT rank=0 start=0", "RESULT rank=1 start=0"}
    results, output = run(10)
    assert results == {"RESULT rank=0 start=7", "RESULT rank=1 start=7"}
    downloads = re.findall(r"autockpt: downloaded (\S+) \(\d+ bytes\)", output)
    assert downloads == [f"{url}/ckpt-step000000007.ckpt"]  # one node: one download for both ranks
    assert not list(tmp_path.glob("autockpt-fetched-*"))  # removed once both ranks loaded it


def test_an_exception_in_a_training_step_surfaces_at_once_while_the_mirror_endpoint_is_silent(
    tmp_path: Path, s3_server: Any
) -> None:
    """The failure path never waits for the mirror: before, ``on_exception`` waited for the
    upload in flight, and a silent endpoint kept the exception inside ``fit()`` for good."""
    import time

    import lightning.pytorch as pl

    from autockpt_lightning import AutoCheckpoint
    from tests.fault_proxy import FaultProxy
    from tests.lightning.lightning_helpers import TinyData, TinyModel, make_trainer

    proxy = FaultProxy(s3_server.port).start()
    raised_at: list[float] = []

    class SilencesThenFails(TinyModel):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.global_step == 3:
                proxy.stall()  # the endpoint goes silent: the uploads of steps 5 and 10 hang
            if self.global_step == 12:
                raised_at.append(time.monotonic())
                raise RuntimeError("a bug in training_step")
            return super().training_step(batch, batch_idx)

    options = {"endpoint_url": proxy.endpoint, "key": "testing", "secret": "testing"}
    callback = AutoCheckpoint(
        str(tmp_path / "ckpts"), mirror=s3_server.url(f"silent-{uuid.uuid4().hex[:8]}"), storage_options=options,
        every_n_steps=5, warmup_steps=0, verbose=False,
    )  # fmt: skip
    trainer: pl.Trainer = make_trainer(tmp_path, [callback], max_steps=30, enable_checkpointing=False)
    try:
        with pytest.raises(RuntimeError, match="a bug in training_step"):
            trainer.fit(SilencesThenFails(), datamodule=TinyData())
        surfaced_s = time.monotonic() - raised_at[0]
    finally:
        proxy.stop()
    print(f"\nexception to fit() raising: {surfaced_s:.2f} s (endpoint silent, mirror_stall_timeout 120 s)")
    assert surfaced_s < 10  # the claim's release waits at most 5 s for the silent store
    assert [r.step for r in read_manifest(storage_for(str(tmp_path / "ckpts")))] == [5, 10]
