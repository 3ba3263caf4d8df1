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


@pytest.mark.integration
def test_the_readme_walk_ctrl_c_rerun_inspect_export(tmp_path: Path) -> None:
    """The README's first hour, as a terminal runs it: `autockpt demo`, Ctrl-C (SIGINT to the
    foreground process group) once a checkpoint exists, the same command again resumes from the
    step Ctrl-C committed, `autockpt inspect` names it, `autockpt export` writes a plain .ckpt."""
    import os
    import re
    import signal
    import subprocess
    import time

    import torch

    from tests.console import AUTOCKPT

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [AUTOCKPT, "demo", "--framework", "lightning", "--dirpath", str(tmp_path), "--steps", "5000"]
    demo = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    manifest = tmp_path / "lightning" / "autockpt-manifest.json"
    deadline = time.monotonic() + 120
    while not manifest.exists() and demo.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # a few steps past the first checkpoint
    os.killpg(demo.pid, signal.SIGINT)
    out, _ = demo.communicate(timeout=120)
    assert demo.returncode == 130, out[-3000:]
    said = re.search(r"interrupted by SIGINT: the checkpoint of step (\d+) is committed in ", out)
    assert said is not None and "KeyboardInterrupt" not in out, out[-3000:]
    step = int(said.group(1))

    rerun = autockpt(*argv[1:-1], str(step + 10), env={"OMP_NUM_THREADS": "1"})
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert f"resumed from step {step} (rerun with a larger --steps" in rerun.stdout
    listed = autockpt("inspect", str(tmp_path / "lightning"))
    assert f"* a rerun resumes from step {step + 10} " in listed.stdout, listed.stdout
    exported = autockpt("export", str(tmp_path / "lightning"), str(tmp_path / "model.ckpt"))
    assert exported.returncode == 0, exported.stderr
    checkpoint = torch.load(tmp_path / "model.ckpt", weights_only=True)
    assert checkpoint["global_step"] == step + 10 and "AutoCheckpoint" not in checkpoint.get("callbacks", {})
