"""examples/interval_sweep.py: its verdict from the runs, and a short real sweep end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

from interval_sweep import verdicts  # noqa: E402


def _run(every: str, overhead: float | None, interval: int) -> dict[str, object]:
    return {"every": every, "overhead": overhead, "interval": interval}


def test_the_reference_is_the_shortest_fixed_interval_within_the_budget() -> None:
    runs = [_run("budget", 0.018, 450), _run("150", 0.037, 150), _run("300", 0.019, 300),
            _run("600", 0.013, 600), _run("budget", 0.019, 210)]  # fmt: skip
    out = verdicts(runs, 0.02)
    assert out["shortest_within_budget"] == 300 and out["chosen"] == [450, 210]
    assert out["ratios"] == pytest.approx([1.5, 0.7])
    assert verdicts([_run("150", 0.05, 150), _run("budget", 0.01, 900)], 0.02)["ratios"] is None


@pytest.mark.integration
def test_a_short_sweep_runs_each_interval_in_its_own_process(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "interval_sweep.py"), "--frameworks", "lightning", "--every", "20",
         "--steps-per-epoch", "40", "--epochs", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(out.read_text())["frameworks"]["lightning"]["runs"]
    assert [r["every"] for r in runs] == ["budget", "20", "budget"]
    assert runs[1]["steps"] == [20, 40] and runs[1]["rule"] == "every_n_steps"
    assert "shortest fixed interval within the budget" in done.stdout
