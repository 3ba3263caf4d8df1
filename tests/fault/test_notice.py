"""``preemption_notice``: a notice from a local metadata endpoint (a real HTTP server on 127.0.0.1)
commits the emergency checkpoint and ends the run within seconds of the notice, in both frameworks
(Keras on TensorFlow); the rerun resumes there and ends bitwise equal to an uninterrupted run."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from tests.fault.harness import assert_weights_equal, load_weights, run_baseline, run_once
from tests.fault.test_deadline import RUNS
from tests.metadata_server import serving

pytestmark = pytest.mark.integration


def _notice_after_first_checkpoint(server: object, dirpath: Path, noticed: list[float], stop: threading.Event) -> None:
    """The notice goes up once training wrote its first checkpoint (training is under way)."""
    while not stop.is_set():
        if dirpath.exists() and any(p.name.startswith("ckpt-step") for p in dirpath.iterdir()):
            server.notice = True  # type: ignore[attr-defined]
            noticed.append(time.monotonic())
            return
        time.sleep(0.05)


@pytest.mark.parametrize("framework", sorted(RUNS))
def test_a_notice_commits_and_ends_the_run_within_seconds_and_the_rerun_resumes(framework: str, tmp_path: Path) -> None:
    command, args, resumed = RUNS[framework]
    expected = run_baseline(command, tmp_path, args)
    dirpath = tmp_path / "ckpts"
    noticed: list[float] = []
    stop = threading.Event()
    with serving() as server:
        watcher = threading.Thread(target=_notice_after_first_checkpoint, args=(server, dirpath, noticed, stop))
        watcher.start()
        try:
            first = run_once(command, dirpath, tmp_path / "first.npz",
                             extra_args=[*args, "--notice", f"gce:{server.base}", "--step-sleep", "0.2"])  # fmt: skip
            ended = time.monotonic()
        finally:
            stop.set()
            watcher.join()
        polls = [path for method, path, _ in server.seen]
    assert first.returncode == 143, first.output[-3000:]
    assert noticed and ended - noticed[0] < 5.0, (ended - noticed[0] if noticed else None, first.output[-3000:])
    assert set(polls) == {"/computeMetadata/v1/instance/preempted"} and len(polls) >= 2
    said = re.search(r"the preemption notice came \(SIGTERM\); checkpoint of step (\d+) committed", first.output)
    assert said is not None, first.output[-3000:]
    step = int(said.group(1))
    assert first.newest_step == step and 0 < step < 120
    assert "gce preemption notice (instance/preempted is TRUE)" in first.output
    second = run_once(command, dirpath, tmp_path / "second.npz", extra_args=args)
    assert second.returncode == 0, second.output[-3000:]
    assert re.search(resumed.format(step=step), second.output), second.output[-3000:]
    assert_weights_equal(load_weights(tmp_path / "second.npz"), expected)
