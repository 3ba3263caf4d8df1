"""examples/process_fixed_costs.py runs end to end: each worker's fit() ends as a user's does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_process_is_split_and_autockpt_ends_with_its_final_checkpoint(tmp_path: Path) -> None:
    out, work = tmp_path / "costs.json", tmp_path / "work"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "process_fixed_costs.py"), "--steps", "20", "--rounds", "1",
         "--methods", "none,autockpt", "--json", str(out), "--work", str(work)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    for framework in ("lightning", "keras"):
        for method in ("none", "autockpt"):
            (run,) = runs[framework][method]
            parts = ("start_s", "to_resume_s", "train_s", "fit_end_s", "exit_s")
            assert all(run[p] >= 0 for p in parts) and abs(sum(run[p] for p in parts) - run["wall_s"]) < 1e-6
        # AutoCheckpoint(dirpath) with nothing else set takes a final checkpoint as fit() ends:
        # the Keras worker no longer exits at the last step
        final = list((work / f"{framework}-autockpt" / "ckpt").glob("*step000000020*"))
        assert final, sorted(p.name for p in (work / f"{framework}-autockpt" / "ckpt").iterdir())
    assert "| keras | autockpt |" in done.stdout and "fit end s" in done.stdout
