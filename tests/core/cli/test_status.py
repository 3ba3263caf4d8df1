"""``autockpt status DIR``: the status file, the manifest where there is none, clear errors."""

import json
import os

import pytest

from autockpt_core.cli import main
from autockpt_core.run_status import KEYS, STATUS_NAME
from tests.core.cli.test_inspect import ckpt_dir  # noqa: F401  (fixture: 3 checkpoints, a finished session)


def test_status_json_from_the_status_file(ckpt_dir, capsys) -> None:  # noqa: F811
    assert main(["status", str(ckpt_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert set(KEYS) <= set(status) and status["source"] == STATUS_NAME
    assert (status["state"], status["last_durable_step"], status["pid"]) == ("finished", 6, os.getpid())


def test_status_table_says_the_process_runs(ckpt_dir, capsys) -> None:  # noqa: F811
    assert main(["status", str(ckpt_dir)]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and "last durable step" in out and f"{os.getpid()} on" in out and "running" in out


def test_status_from_the_manifest_alone(ckpt_dir, capsys) -> None:  # noqa: F811
    (ckpt_dir / STATUS_NAME).unlink()
    assert main(["status", str(ckpt_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["state"], status["last_durable_step"], status["source"]) == ("unknown", 6, "autockpt-manifest.json")
    assert status["work_at_risk_s"] is None


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p.mkdir(), "is not an autockpt directory"),
    (lambda p: p.write_text("x"), "is not a directory"),
    (lambda p: None, "is not a directory"),
])
def test_status_of_something_else_is_one_clear_line(tmp_path, capsys, make, message) -> None:
    target = tmp_path / "other"
    make(target)
    assert main(["status", str(target)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_version_and_a_missing_directory(tmp_path, capsys) -> None:
    assert main(["--version"]) == 0 and capsys.readouterr().out.startswith("autockpt 0.")
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert "nope does not exist" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["inspect", str(tmp_path / "file")]) == 2
    assert "is not a directory" in capsys.readouterr().err
