"""Keras with ``dirpath="s3://..."`` and ``storage_options``, against a real S3-compatible
server (moto, a process on 127.0.0.1): a first process trains two epochs with a checkpoint
every 3 steps; a rerun of the same command in a new process resumes from the newest object
mid-epoch and ends with the weights of an uninterrupted run (both backends). With a node-local
``dirpath`` and the bucket as ``mirror``, a rerun on a node whose disk is empty resumes from
the bucket the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from autockpt_core import read_manifest, storage_for
from tests.keras.test_keras_adapter import ROOT, SCRIPT

pytestmark = pytest.mark.integration


def run_phase(backend: str, phase: str, workdir: Path, s3: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, KERAS_BACKEND=backend, OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1",
               TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", AUTOCKPT_TEST_S3=json.dumps(s3))
    proc = subprocess.run([sys.executable, str(SCRIPT), phase, str(workdir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    out = workdir / f"{phase}.json"
    assert out.exists(), f"{backend}/{phase} wrote no result (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(out.read_text())
    assert "error" not in result, f"{backend}/{phase} failed:\n{result['error']}"
    return result


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_keras_checkpoints_to_s3_and_a_rerun_resumes_exactly(backend: str, s3_server: Any, tmp_path: Path) -> None:
    s3 = {"url": s3_server.url(f"keras-{backend}-{uuid.uuid4().hex[:8]}"), "storage_options": s3_server.storage_options}
    first = run_phase(backend, "s3-first", tmp_path, s3)["run"]
    assert first["latest"] == f"{s3['url']}/ckpt-step000000018.safetensors"
    assert first["persist_mode"] == "thread"  # a persist process writes local files only
    names = [p.rsplit("/", 1)[-1] for p in s3_server.filesystem().ls(s3["url"][len("s3://"):], detail=False)]
    assert "autockpt-manifest.json" in names and len([n for n in names if n.endswith(".safetensors")]) == 6  # steps 3..18

    resumed = run_phase(backend, "s3-resume", tmp_path, s3)
    run, local = resumed["run"], resumed["local"]
    assert run["restored"]["step"] == 18 and run["restore_mismatched"] == []
    assert run["iterations_at_end"] == 40
    assert run["digest"] == local["digest"]  # bitwise the weights of the uninterrupted local run


def test_keras_with_a_node_local_tier_resumes_from_the_s3_mirror_on_an_empty_node(
    s3_server: Any, tmp_path: Path
) -> None:
    s3 = {"url": s3_server.url(f"keras-mirror-{uuid.uuid4().hex[:8]}"), "storage_options": s3_server.storage_options}
    first = run_phase("torch", "mirror-first", tmp_path, s3)["run"]
    assert first["latest"] == str(tmp_path / "node-a" / "ckpt-step000000018.safetensors")
    assert first["summary"] is None or "mirrored to" in first["summary"]
    remote = read_manifest(storage_for(s3["url"], s3["storage_options"]))
    assert remote[-1].step == 18  # finish() waited for the last upload

    resumed = run_phase("torch", "mirror-resume", tmp_path, s3)
    run, local = resumed["run"], resumed["local"]
    assert run["restored"]["step"] == 18 and run["copied_from_mirror"] is True and run["restore_mismatched"] == []
    assert run["iterations_at_end"] == 40 and run["digest"] == local["digest"]
    assert read_manifest(storage_for(s3["url"], s3["storage_options"]))[-1].name == Path(run["latest"]).name
