"""The Lightning demo (``python -m autockpt_lightning.demo``; ``autockpt demo`` runs it): a short
run prints measured values and the decisions, and a rerun resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from autockpt_lightning import demo, latest_checkpoint  # noqa: E402

torch.set_num_threads(1)


@pytest.mark.integration
def test_demo_prints_decisions_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--dirpath", str(tmp_path / "d"), "--budget", "50%", "--steps", "60", "--hidden", "32", "--layers", "1"]
    assert demo.main(args) == 0
    out = capsys.readouterr().out
    assert "profiling: first checkpoint measures stall and persist" in out
    assert "measured: iteration" in out and "autockpt: " in out
    assert latest_checkpoint(tmp_path / "d") is not None

    assert demo.main([*args[:-4], "--steps", "70", "--hidden", "32", "--layers", "1"]) == 0  # rerun resumes
    assert "resumed from step" in capsys.readouterr().out

