"""``autockpt export DIR OUT`` (autockpt_bench/export.py): the command, and what it refuses.

Directories here hold made-up checkpoints (bytes and a manifest), so nothing imports a
framework; the exports of really trained checkpoints are in tests/lightning/test_export.py
and tests/keras/test_export.py.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from autockpt_bench import cli
from autockpt_core.persist import CheckpointRecord, LocalStorage, WriteResult
from autockpt_core.persist.manifest import write_manifest
from tests.console import autockpt


def made_up(directory: Path, *checkpoints: tuple[str, int]) -> list[CheckpointRecord]:
    """A manifest listing one small file per (framework, step), committed in that order."""
    storage = LocalStorage(directory, fsync=False)
    records = []
    for framework, step in checkpoints:
        suffix = ".ckpt" if framework == "lightning" else ".safetensors"
        result = storage.write_atomic(f"ckpt-step{step:09d}{suffix}", lambda f, s=step: f.write(b"x" * s))
        records.append(CheckpointRecord.from_write(result, step, 0, framework))
    write_manifest(storage, records)
    return records


def export(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["export", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_export_is_a_command_of_the_console_script() -> None:
    done = autockpt("export", "--help")
    assert done.returncode == 0, done.stderr
    assert "autockpt export [-h]" in done.stdout and "DIR OUT" in done.stdout
    for flag in ("--step", "--seq", "--model", "--storage-options", "--force", "--allow-pickle", "--framework"):
        assert flag in done.stdout
    assert "export" in autockpt("--help").stdout


@pytest.mark.parametrize(
    "out, why",
    [
        ("model.h5", "cannot tell the format of 'model.h5' from its ending (Keras' weights files end in .weights.h5); "
                     "use one of .ckpt, .weights.h5, .keras, .safetensors"),
        ("model.pt", "cannot tell the format of 'model.pt' from its ending; use one of .ckpt, .weights.h5, .keras, .safetensors"),
    ],
)
def test_an_unknown_ending_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, out: str, why: str) -> None:
    made_up(tmp_path / "ck", ("lightning", 5))
    assert export(capsys, tmp_path / "ck", out) == (2, "", f"autockpt export: error: {why}\n")


def test_a_directory_without_a_manifest_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "m.ckpt"
    assert export(capsys, tmp_path, out) == (2, "", f"autockpt export: error: no autockpt manifest (autockpt-manifest.json) in {tmp_path}\n")
    assert export(capsys, tmp_path / "nope", out)[2] == f"autockpt export: error: {tmp_path / 'nope'} does not exist\n"
    assert not out.exists()


def test_an_ending_of_another_framework_names_the_endings_that_fit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    made_up(tmp_path / "keras", ("keras", 3))
    made_up(tmp_path / "lightning", ("lightning", 3))
    assert export(capsys, tmp_path / "keras", tmp_path / "m.ckpt")[2] == (
        f"autockpt export: error: {tmp_path / 'keras'} holds Keras checkpoints; a .ckpt file is for Lightning. "
        "Fix: name OUT with .weights.h5 or .keras or .safetensors\n"
    )
    assert export(capsys, tmp_path / "lightning", tmp_path / "m.keras")[2] == (
        f"autockpt export: error: {tmp_path / 'lightning'} holds Lightning checkpoints; a .keras file is for Keras. "
        "Fix: name OUT with .ckpt or .safetensors\n"
    )


def test_a_keras_model_file_without_model_names_the_fix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    made_up(tmp_path / "ck", ("keras", 3))
    for ending in (".keras", ".weights.h5"):
        code, out, err = export(capsys, tmp_path / "ck", tmp_path / f"m{ending}")
        assert (code, out) == (2, "")
        assert err == (
            "autockpt export: error: a Keras checkpoint holds weights but no architecture: pass --model "
            f"MODULE:FUNCTION (a function that returns the built model) to write {ending}, or write OUT as "
            ".safetensors (weights only, no model needed)\n"
        )


def test_flags_of_the_other_framework_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    made_up(tmp_path / "keras", ("keras", 3))
    made_up(tmp_path / "lightning", ("lightning", 3))
    assert export(capsys, tmp_path / "lightning", tmp_path / "m.ckpt", "--model", "m:f")[2] == (
        "autockpt export: error: --model applies to Keras .weights.h5 and .keras files, not to a Lightning .ckpt\n"
    )
    assert export(capsys, tmp_path / "keras", tmp_path / "m.safetensors", "--allow-pickle")[2] == (
        "autockpt export: error: --allow-pickle applies to Lightning checkpoints (Keras checkpoints hold no pickles)\n"
    )


def test_a_directory_of_both_frameworks_asks_whose(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    made_up(tmp_path, ("keras", 3), ("lightning", 4))
    assert export(capsys, tmp_path, tmp_path / "m.safetensors")[2] == (
        f"autockpt export: error: {tmp_path} holds Keras and Lightning checkpoints; pass --framework to say whose to export\n"
    )


def test_a_step_or_seq_not_listed_names_those_listed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    made_up(tmp_path, ("lightning", 5), ("lightning", 10), ("keras", 7))
    assert export(capsys, tmp_path, tmp_path / "m.ckpt", "--step", "7")[2] == (
        f"autockpt export: error: no Lightning checkpoint of step 7 in {tmp_path} (its steps: 5, 10)\n"
    )
    assert export(capsys, tmp_path, tmp_path / "m.ckpt", "--seq", "3")[2] == (
        f"autockpt export: error: no Lightning checkpoint with seq 3 in {tmp_path} (its seqs: 1, 2)\n"
    )


def test_an_existing_out_or_a_checkpoint_file_is_not_replaced(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    made_up(tmp_path, ("lightning", 5))
    out = tmp_path / "m.ckpt"
    out.write_bytes(b"mine")
    assert export(capsys, tmp_path, out)[2] == f"autockpt export: error: {out} exists; pass --force to replace it\n"
    assert out.read_bytes() == b"mine"
    listed = tmp_path / "ckpt-step000000005.ckpt"
    assert export(capsys, tmp_path, listed, "--force")[2] == (
        f"autockpt export: error: {listed} is one of the files autockpt keeps in {tmp_path}; write OUT elsewhere\n"
    )
    assert listed.read_bytes() == b"x" * 5


def test_a_sharded_checkpoint_is_named_with_how_lightning_loads_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "ckpt-step000000004").mkdir()
    (tmp_path / "ckpt-step000000004" / "meta.pt").write_bytes(b"abc")
    files = {"meta.pt": [3, f"{zlib.crc32(b'abc'):08x}"]}
    result = WriteResult("ckpt-step000000004", 3, "", files=files)
    write_manifest(LocalStorage(tmp_path), [CheckpointRecord.from_write(result, 4, 0, "lightning")])
    assert export(capsys, tmp_path, tmp_path / "m.ckpt")[2] == (
        "autockpt export: error: the checkpoint of step 4 (ckpt-step000000004) is a sharded model's directory, which "
        "this command does not convert; Lightning loads it as it is: "
        f"trainer.fit(ckpt_path={str(tmp_path / 'ckpt-step000000004')!r})\n"
    )
