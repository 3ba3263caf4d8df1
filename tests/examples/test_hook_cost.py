"""examples/hook_cost.py runs end to end: every hook of a real Lightning fit timed, the core loops."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_hook_cost_benchmark_times_every_step_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "hooks.json"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "hook_cost.py"), "--steps", "30", "--frameworks", "lightning",
         "--core-steps", "20", "--json", str(out), "--parts"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    hooks = results["fit"]["lightning"]["hooks"]
    assert hooks["on_train_batch_end"]["calls"] == 30  # one per optimizer step
    assert hooks["  driver.step_end"]["calls"] == 30
    assert hooks["Lightning's dispatch of on_train_batch_end"]["calls"] == 30  # measured apart
    assert 0 < hooks["    driver._decide (a decision)"]["calls"] < 30  # the rest only noted their step
    assert all(row["median_us"] > 0 for row in hooks.values())
    assert set(results["core"]) == {"warm", "after_a_matmul"}
    assert "lightning: 30 steps" in done.stdout and "per-step calls" in done.stdout
