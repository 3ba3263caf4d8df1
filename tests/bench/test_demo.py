"""``autockpt demo`` through the console script: its flags reach the framework's demo, and a
rerun of a finished demo says how to train further with a flag the command accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.console import autockpt

pytest.importorskip("lightning")


@pytest.mark.integration
def test_a_finished_lightning_demo_rerun_names_the_steps_flag_of_autockpt_demo(tmp_path: Path) -> None:
    argv = ("demo", "--framework", "lightning", "--dirpath", str(tmp_path), "--steps", "20")
    first = autockpt(*argv, env={"OMP_NUM_THREADS": "1"})
    assert first.returncode == 0, first.stderr[-3000:]
    assert ", 20 steps, budget" in first.stdout and "newest step 20 ->" in first.stdout
    again = autockpt(*argv, env={"OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing left to train: the checkpoint of step 20 already reached --steps 20" in again.stdout
    assert "rerun with --steps 40" in again.stdout
    assert "no checkpoints taken" not in again.stdout
    assert "--steps" in autockpt("demo", "--help").stdout
