"""``autockpt export`` of really trained Lightning checkpoints (autockpt_lightning/export.py):
a ``.ckpt`` that plain Lightning loads and resumes from, the ``state_dict`` as safetensors, and
the checkpoint the command picks when files are corrupt or hold objects a weights-only load refuses.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from autockpt_bench import cli
from autockpt_core.persist import CheckpointRecord, LocalStorage, read_manifest
from autockpt_core.persist.manifest import write_manifest
from autockpt_lightning import AutoCheckpoint
from tests.console import autockpt
from tests.lightning.lightning_helpers import Recorder, TinyData, TinyModel, make_trainer

pytestmark = pytest.mark.integration

STEPS = (5, 10, 12)  # every 5 steps, and the end of training (8 batches an epoch)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, torch.Tensor]]]:
    """A directory of checkpoints of steps 5, 10 and 12, and the module's weights at those steps."""
    root = tmp_path_factory.mktemp("lightning-export")
    auto = AutoCheckpoint(root / "ck", every_n_steps=5, verbose=False)
    recorder = Recorder(auto, capture_steps=STEPS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plain DataLoader's not-exact resume warning
        make_trainer(root, [auto, recorder], max_steps=12, enable_checkpointing=False).fit(TinyModel(), TinyData(samples=64))
    assert [r.step for r in read_manifest(LocalStorage(root / "ck"))] == list(STEPS)
    return root / "ck", recorder.captured


def export(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = cli.main(["export", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def assert_weights(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(state[key], value), key


def test_a_ckpt_export_loads_and_resumes_in_plain_lightning(trained: Any, tmp_path: Path) -> None:
    ck, captured = trained
    out = tmp_path / "model.ckpt"
    done = autockpt("export", str(ck), str(out))
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        rf"wrote {re.escape(str(out))} \(\d+\.\dKB\): Lightning checkpoint of step 12 "
        rf"from {re.escape(str(ck))}/ckpt-step000000012.ckpt, "
        r"without autockpt's callback state\n",
        done.stdout,
    ), done.stdout
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(out)) == []  # a weights-only load takes it
    saved = torch.load(out, weights_only=True)
    assert saved["global_step"] == 12 and saved["callbacks"] == {} and saved["optimizer_states"]
    assert_weights(TinyModel.load_from_checkpoint(out).state_dict(), captured[12])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = make_trainer(tmp_path, [], max_steps=14, enable_checkpointing=False)  # no AutoCheckpoint
        trainer.fit(TinyModel(), TinyData(samples=64), ckpt_path=str(out))
    assert trainer.global_step == 14
    assert not [w for w in caught if "callbacks" in str(w.message) or "AutoCheckpoint" in str(w.message)]


def test_an_older_steps_state_dict_as_safetensors(trained: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    ck, captured = trained
    out = tmp_path / "model.safetensors"
    code, printed, err = export(capsys, ck, out, "--step", "5")
    assert (code, err) == (0, "")
    assert re.fullmatch(
        rf"wrote {re.escape(str(out))} \(\d+\.\dKB\): the LightningModule's state_dict \(4 tensors\) of step 5 "
        rf"from {re.escape(str(ck))}/ckpt-step000000005.ckpt\n",
        printed,
    ), printed
    assert_weights(load_file(out), captured[5])
    with safe_open(out, "pt") as f:
        assert f.metadata() == {"framework": "lightning", "format": "pt", "step": "5", "epoch": "0", "source": "ckpt-step000000005.ckpt"}
    TinyModel().load_state_dict(load_file(out), strict=True)
    assert export(capsys, ck, tmp_path / "seq.safetensors", "--seq", "2")[1].startswith(
        f"wrote {tmp_path / 'seq.safetensors'} ("
    )
    assert_weights(load_file(tmp_path / "seq.safetensors"), captured[10])


@pytest.fixture
def corrupt_newest(trained: Any, tmp_path: Path) -> Path:
    """A copy of the directory whose newest checkpoint (step 12) has one byte changed."""
    ck = Path(shutil.copytree(trained[0], tmp_path / "ck"))
    newest = ck / "ckpt-step000000012.ckpt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    return ck


def test_a_corrupt_newest_checkpoint_is_passed_over_as_a_resume_does(
    corrupt_newest: Path, trained: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model.ckpt"
    code, printed, err = export(capsys, corrupt_newest, out)
    assert code == 0
    assert err.startswith(f"autockpt: skipping checkpoint ckpt-step000000012.ckpt (step 12) in {corrupt_newest}: checksum")
    assert err.rstrip().endswith("falling back to an older checkpoint") and err.count("\n") == 1
    assert f"of step 10 from {corrupt_newest}/ckpt-step000000010.ckpt" in printed
    assert_weights(torch.load(out, weights_only=True)["state_dict"], trained[1][10])


def test_a_corrupt_chosen_step_is_an_error_and_writes_nothing(
    corrupt_newest: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, printed, err = export(capsys, corrupt_newest, out_dir / "model.ckpt", "--step", "12")
    assert (code, printed) == (2, "")
    assert err.splitlines()[-1] == (
        f"autockpt export: error: no Lightning checkpoint of step 12 in {corrupt_newest} verifies (each one is named above)"
    )
    assert list(out_dir.iterdir()) == []


def test_force_replaces_out(trained: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model.ckpt"
    out.write_bytes(b"old")
    assert export(capsys, trained[0], out)[0] == 2 and out.read_bytes() == b"old"
    assert export(capsys, trained[0], out, "--force", "--step", "10")[0] == 0
    assert torch.load(out, weights_only=True)["global_step"] == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ckpt"]  # no temporary file left


def test_objects_a_weights_only_load_refuses_need_allow_pickle(
    trained: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck = Path(shutil.copytree(trained[0], tmp_path / "ck"))
    storage = LocalStorage(ck)
    records = read_manifest(storage)
    newest = records[-1]
    checkpoint = torch.load(ck / newest.name, weights_only=True)
    checkpoint["hyper_parameters"] = argparse.Namespace(hidden=16, lr=0.01)  # as save_hyperparameters(args)
    result = storage.write_atomic(newest.name, lambda f: torch.save(checkpoint, f))
    write_manifest(storage, [*records[:-1], dataclasses.replace(newest, size=result.size, checksum=result.checksum)])

    out = tmp_path / "model.ckpt"
    code, printed, err = export(capsys, ck, out)
    assert (code, printed) == (2, "")
    assert err == (
        f"autockpt export: error: {ck}/{newest.name} holds argparse.Namespace, which a weights-only load refuses. "
        f"Fix: --allow-pickle if you trust everyone who can write {ck} (unpickling runs code named in the file)\n"
    )
    assert not out.exists()
    assert export(capsys, ck, out, "--allow-pickle")[0] == 0
    assert torch.load(out, weights_only=False)["hyper_parameters"] == argparse.Namespace(hidden=16, lr=0.01)


def test_a_file_torch_cannot_load_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = LocalStorage(tmp_path / "ck")
    result = storage.write_atomic("ckpt-step000000003.ckpt", lambda f: f.write(b"not a torch file"))
    write_manifest(storage, [CheckpointRecord.from_write(result, 3, 0, "lightning")])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, _, err = export(capsys, tmp_path / "ck", out_dir / "m.ckpt")
    assert code == 2
    assert err.startswith(f"autockpt export: error: {tmp_path / 'ck'}/ckpt-step000000003.ckpt does not load as a torch checkpoint (")
    assert list(out_dir.iterdir()) == []


def test_a_url_directory_is_read_through_fsspec(trained: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fsspec

    ck, captured = trained
    url = f"memory://autockpt-export-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    for path in ck.iterdir():
        fs.pipe(f"{url}/{path.name}", path.read_bytes())
    out = tmp_path / "model.ckpt"
    try:
        code, printed, _ = export(capsys, url, out, "--storage-options", "{}")
    finally:
        fs.rm(url, recursive=True)
    assert code == 0 and f"of step 12 from {url}/ckpt-step000000012.ckpt" in printed
    assert_weights(torch.load(out, weights_only=True)["state_dict"], captured[12])
