import json

import numpy as np
import pytest

from autockpt_core import CheckpointSession, Config, Snapshot, write_tensor_file
from autockpt_core.cli import main


@pytest.fixture()
def ckpt_dir(tmp_path):
    session = CheckpointSession(
        Config(dirpath=str(tmp_path), every_n_steps=2, async_persist=False), framework="np", suffix=".safetensors"
    )
    arr = np.arange(1000, dtype=np.float32)
    session.start(0)
    for step in range(1, 7):
        if session.step_end(step).save:
            session.save(step, 1, lambda pool: Snapshot(write=lambda f: write_tensor_file(f, {"a": arr}), nbytes=arr.nbytes))
    session.finish()
    return tmp_path


def test_inspect_table(ckpt_dir, capsys) -> None:
    assert main(["inspect", str(ckpt_dir)]) == 0
    out = capsys.readouterr().out
    assert "ckpt-step000000006.safetensors" in out and "ok" in out and "crc32:" in out


def test_inspect_json_reports_corruption(ckpt_dir, capsys) -> None:
    newest = ckpt_dir / "ckpt-step000000006.safetensors"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF
    newest.write_bytes(bytes(data))
    assert main(["inspect", str(ckpt_dir), "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert [r["seq"] for r in rows] == [1, 2, 3] and len({r["run"] for r in rows}) == 1
    assert rows[0]["status"] == "ok" and "checksum" in rows[-1]["status"]


def test_inspect_missing_dir_is_clear_error(tmp_path, capsys) -> None:
    assert main(["inspect", str(tmp_path / "none")]) == 2
    assert "none does not exist" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path)]) == 2  # a directory, not autockpt's
    assert "no autockpt manifest" in capsys.readouterr().err


def test_inspect_through_the_console_says_why_and_where_a_rerun_resumes(tmp_path) -> None:
    from tests.console import autockpt

    session = CheckpointSession(Config(dirpath=str(tmp_path), every_n_steps=2, async_persist=False), framework="np",
                                suffix=".safetensors")
    arr = np.arange(10, dtype=np.float32)
    session.start(0)
    for step in (2, 4, 6):
        session.save(step, 0, lambda pool: Snapshot(write=lambda f: write_tensor_file(f, {"a": arr}), nbytes=arr.nbytes),
                     reason=f"interval reached at {step}")
    session.finish()
    newest = tmp_path / "ckpt-step000000006.safetensors"
    newest.write_bytes(newest.read_bytes()[:-1] + b"\x00")  # the newest is torn: a rerun takes step 4
    table = autockpt("inspect", str(tmp_path))
    assert table.returncode == 1  # a checkpoint failed its checksum
    assert " why " in table.stdout and "framework" in table.stdout and "interval" in table.stdout
    assert "* a rerun resumes from step 4 (ckpt-step000000004.safetensors, np)" in table.stdout
    assert "last run: finished (autockpt-status.json" in table.stdout
    rows = json.loads(autockpt("inspect", str(tmp_path), "--json").stdout)
    assert [r["resume"] for r in rows] == [False, True, False]
    assert rows[0]["reason"] == "interval reached at 2" and rows[0]["exact"] is True
