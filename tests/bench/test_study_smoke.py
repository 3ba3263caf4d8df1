"""Smoke runs of ``autockpt compare`` and ``autockpt goodput`` with the real framework workers:
the installed command, real training in Lightning and Keras, real SIGKILLs (CI's check that
the study still runs end to end; the full study is ``docs/comparison.md``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def _autockpt(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "autockpt_bench", *argv], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)


def test_compare_quick_small_in_both_frameworks(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    pytest.importorskip("keras")
    out = tmp_path / "cmp"
    proc = _autockpt("compare", "--quick", "--workloads", "small", "--methods", "autockpt,modelcheckpoint,modelcheckpoint-h5",
                     "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    failed = [(r["framework"], r["method"]["name"], r["train"].get("error"), (r["restore"] or {}).get("error"))
              for r in results["runs"] if "error" in r["train"] or "error" in (r["restore"] or {})]
    assert not failed
    rows = {(r["framework"], r["method"]): r for r in results["rows"]}
    for framework, native in (("lightning", "modelcheckpoint"), ("keras", "modelcheckpoint-h5")):
        auto, ref = rows[(framework, "autockpt")], rows[(framework, native)]
        assert auto["exact"] is True, auto  # autockpt's resume is exact in both frameworks
        assert auto["checkpoints"] == ref["checkpoints"] == 3 and auto["interval_steps"] == 5
        assert auto["blocked_ms"] > 0 and ref["blocked_ms"] > 0 and auto["restore_s"] > 0 and ref["checkpoint_bytes"] > 0
    md = (out / "results.md").read_text()
    assert "PyTorch / Lightning" in md and "TensorFlow / Keras" in md
    assert (out / "blocked_vs_size.png").exists()


@pytest.mark.parametrize("framework", ["lightning", "keras"])
def test_goodput_quick_kills_and_finishes(tmp_path: Path, framework: str) -> None:
    pytest.importorskip(framework)
    out = tmp_path / "gp"
    proc = _autockpt("goodput", "--quick", "--framework", framework, "--work", "4s", "--mtbf", "12s", "--epochs", "2",
                     "--methods", "every_epoch,autockpt", "--seed", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "goodput.json").read_text())
    assert result["framework"] == framework and result["failure_free_s"] > 0
    assert [m["kind"] for m in result["methods"]] == ["every_epoch", "autockpt"]
    for m in result["methods"]:
        assert m["finished"], m
        assert m["predicted"]["expected"]["wall_s"] > 0
    assert sum(m["kills"] for m in result["methods"]) >= 1  # seed 2 kills early: the first gap is < the startup + job
