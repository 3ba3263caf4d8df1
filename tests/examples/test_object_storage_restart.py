"""examples/object_storage_restart.py runs end to end: both methods resume from the bucket and
read the checkpoint once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow  # 14 s: four Lightning processes; the behaviour is tested in tests/lightning
def test_both_methods_resume_from_the_bucket_reading_the_checkpoint_once(tmp_path: Path) -> None:
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    out = tmp_path / "restart.json"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "object_storage_restart.py"), "--sizes", "4", "--rounds", "1",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert sorted(row["method"] for row in rows) == ["autockpt", "native"]
    for row in rows:
        assert row["restart_s"] > row["fit_to_first_step_s"] > 0
        assert 4 * 2**20 <= row["read_bytes"] < 1.5 * 4 * 2**20, row  # once, not twice
    assert "| 4 MiB | autockpt |" in done.stdout
